"""Datasets for the experiments: real-data loaders, partitions and the paper's synthetic settings.

Everything the benchmarks (``benchmarks/paper.py``) and the CLI (``fedforest simulate --dataset``,
``fedforest compare``) feed to a forest comes from here, as a :class:`Dataset`.

Real data
    :func:`load_dataset` loads the three scikit-learn datasets (``diabetes``, ``breast_cancer``,
    ``wine``) and the offline copies of the paper's benchmark sets kept in ``../shared/data``
    (``bodyfat``, ``space_ga``, ``puma8NH``, ``cpu_act``, ``kin8nm``, ``spectf``, ``madelon``,
    ``banknote``, ``heart_disease``). The shared files are read in place, never copied; their
    directory is ``$FEDFOREST_DATA_DIR`` if set, else ``<project root>/../shared/data`` (see
    :func:`shared_data_dir`). :func:`load_fed_heart_disease` reproduces FLamby's per-hospital
    train/test split of Fed-Heart-Disease. :func:`available_datasets` lists the names.

Partitions (appendix "Benchmark on Public Datasets")
    :func:`dirichlet_partition` spreads a non-federated dataset over ``K`` clients with a Dirichlet
    allocation of groups of similar rows (covariate shift controlled by ``alpha``);
    :func:`even_partition` cuts it into ``K`` random, equal-sized shards (the Banknote
    fragmentation table, ``K = 1..100``). Both return one client index per row.

Synthetic settings (Section 5 "Numerical Results" and appendix "Experimental Setting and
Additional Simulations")
    :func:`tree_distilled_f` (the tree-distilled ground truth ``f``),
    :func:`make_federated_regression` (homogeneous / covariate shift / outcome shift / full),
    :func:`make_disjoint_supports`, :func:`make_overlapping_supports` and
    :func:`contaminate_outliers`.

Client numbering: clients are indexed ``0..K-1``; client ``h`` is the paper's ``k = h + 1``, so
sign patterns written ``(-1)^k`` in the paper give ``-1`` for client 0, ``+1`` for client 1, ...

Randomness: every random function takes a seed or a :class:`numpy.random.Generator` and draws
only from it, so results are deterministic given the seed.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .errors import FedForestError

__all__ = [
    "DATA_DIR_ENV",
    "DataNotFoundError",
    "Dataset",
    "DatasetInfo",
    "SYNTHETIC_SETTINGS",
    "TrainTest",
    "TreeFunction",
    "available_datasets",
    "contaminate_outliers",
    "dirichlet_partition",
    "even_partition",
    "load_dataset",
    "load_fed_heart_disease",
    "make_disjoint_supports",
    "make_federated_regression",
    "make_overlapping_supports",
    "shared_data_dir",
    "tree_distilled_f",
]

Task = Literal["regression", "classification"]
SeedLike = int | np.random.Generator | None
FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: Environment variable that overrides the location of the shared data directory.
DATA_DIR_ENV = "FEDFOREST_DATA_DIR"

_TASKS = ("regression", "classification")


class DataNotFoundError(FedForestError, FileNotFoundError):
    """The shared data directory, or a file expected in it, does not exist."""


# --------------------------------------------------------------------------------------------
# Containers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Dataset:
    """A table ready for a forest.

    Parameters
    ----------
    name : str
        Dataset name (as passed to :func:`load_dataset`, or the generator's setting).
    X : ndarray of shape (n_samples, n_features), float64
        Features.
    y : ndarray of shape (n_samples,)
        Target: float64 for regression, int64 class codes ``0..n_classes-1`` for classification.
    task : {"regression", "classification"}
        Learning task.
    feature_names : tuple of str
        One name per column of ``X``.
    client : ndarray of shape (n_samples,), int64, or None
        Client (institution) index ``0..K-1`` of each row, or None for a non-federated table.
    classes : list or None
        For classification, the original label of each class code (``classes[code]``); None for
        regression.

    Notes
    -----
    Arrays are converted (copied if needed) to the documented dtypes and validated on creation.
    The dataclass is frozen, but the arrays themselves are ordinary numpy arrays.
    """

    name: str
    X: FloatArray
    y: NDArray[Any]
    task: Task
    feature_names: tuple[str, ...]
    client: IntArray | None = None
    classes: list[Any] | None = None

    def __post_init__(self) -> None:
        if self.task not in _TASKS:
            raise ValueError(f"task must be one of {_TASKS}, got {self.task!r}")
        X = np.asarray(self.X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D, got shape {X.shape}")
        n, d = X.shape
        y_raw = np.asarray(self.y)
        if y_raw.shape != (n,):
            raise ValueError(f"y must have shape ({n},), got {y_raw.shape}")
        names = tuple(str(s) for s in self.feature_names)
        if len(names) != d:
            raise ValueError(f"{len(names)} feature names for {d} features")
        if self.task == "regression":
            y = y_raw.astype(np.float64, copy=False)
            if self.classes is not None:
                raise ValueError("classes must be None for a regression dataset")
            classes = None
        else:
            if self.classes is None or len(self.classes) == 0:
                raise ValueError("a classification dataset needs its list of classes")
            y = y_raw.astype(np.int64, copy=False)
            if not np.array_equal(y, y_raw):
                raise ValueError("classification targets must be integer class codes")
            if n and (y.min() < 0 or y.max() >= len(self.classes)):
                raise ValueError(f"class codes must lie in 0..{len(self.classes) - 1}")
            classes = list(self.classes)
        client = None
        if self.client is not None:
            c_raw = np.asarray(self.client)
            if c_raw.shape != (n,):
                raise ValueError(f"client must have shape ({n},), got {c_raw.shape}")
            client = c_raw.astype(np.int64, copy=False)
            if not np.array_equal(client, c_raw) or (n and client.min() < 0):
                raise ValueError("client indices must be non-negative integers")
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "y", y)
        object.__setattr__(self, "feature_names", names)
        object.__setattr__(self, "client", client)
        object.__setattr__(self, "classes", classes)

    @property
    def n_samples(self) -> int:
        """Number of rows."""
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        """Number of feature columns."""
        return int(self.X.shape[1])

    @property
    def n_clients(self) -> int | None:
        """``max(client) + 1``, or None when the dataset carries no client column."""
        if self.client is None:
            return None
        return int(self.client.max()) + 1 if self.client.size else 0

    def with_client(self, client: ArrayLike) -> Dataset:
        """Return a copy of the dataset with ``client`` as its client column.

        Parameters
        ----------
        client : array-like of shape (n_samples,)
            Client index per row, e.g. from :func:`dirichlet_partition`.
        """
        return replace(self, client=np.asarray(client))

    def subset(self, rows: ArrayLike) -> Dataset:
        """Return the rows selected by an index array or a boolean mask (copies)."""
        idx = np.asarray(rows)
        return replace(
            self,
            X=self.X[idx],
            y=self.y[idx],
            client=None if self.client is None else self.client[idx],
        )


@dataclass(frozen=True, eq=False)
class TrainTest:
    """A training set and a held-out test set; unpacks as ``train, test = ...``."""

    train: Dataset
    test: Dataset

    def __iter__(self) -> Iterator[Dataset]:
        return iter((self.train, self.test))


@dataclass(frozen=True)
class DatasetInfo:
    """One entry of :func:`available_datasets`.

    Attributes
    ----------
    name : str
        Name accepted by :func:`load_dataset`.
    task : {"regression", "classification"}
        Learning task.
    needs_shared_data : bool
        True when the data are read from the shared data directory (``../shared/data``); False
        for datasets that ship with scikit-learn.
    description : str
        Origin and shape.
    """

    name: str
    task: Task
    needs_shared_data: bool
    description: str


# --------------------------------------------------------------------------------------------
# Shared data directory and file readers
# --------------------------------------------------------------------------------------------


def shared_data_dir() -> Path:
    """Locate the shared data directory.

    Returns
    -------
    pathlib.Path
        ``$FEDFOREST_DATA_DIR`` if the variable is set and non-empty, else
        ``<project root>/../shared/data``, where the project root is the parent of the
        ``fedforest_secure`` package directory.

    Raises
    ------
    DataNotFoundError
        If the directory does not exist (a :class:`FileNotFoundError`).
    """
    env = os.environ.get(DATA_DIR_ENV, "").strip()
    if env:
        path = Path(env).expanduser()
        origin = f"${DATA_DIR_ENV}"
    else:
        path = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
        origin = "the default location <project root>/../shared/data"
    if not path.is_dir():
        raise DataNotFoundError(
            f"shared data directory not found: {path} (from {origin}). Point ${DATA_DIR_ENV} "
            "at the directory holding heart_disease/, banknote/, pmlb/, ... or use a dataset "
            "that ships with scikit-learn (diabetes, breast_cancer, wine)."
        )
    return path


def _data_file(*parts: str) -> Path:
    path = shared_data_dir().joinpath(*parts)
    if not path.is_file():
        raise DataNotFoundError(f"data file not found: {path}")
    return path


def _read_table(
    path: Path, *, delimiter: str | None, header: bool
) -> tuple[list[str] | None, FloatArray]:
    """Read a numeric delimited text file (optionally gzip-compressed) into float64."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        names = None
        if header:
            line = fh.readline().strip()
            names = [s.strip() for s in line.split(delimiter)]
        data = np.loadtxt(fh, delimiter=delimiter, dtype=np.float64, ndmin=2)
    if names is not None and data.shape[1] != len(names):
        raise ValueError(f"{path}: {len(names)} header fields but {data.shape[1]} columns")
    if not np.all(np.isfinite(data)):
        raise ValueError(f"{path}: non-finite values")
    return names, data


def _classification(
    name: str, X: FloatArray, labels: NDArray[Any], names: Sequence[str], **kw: Any
) -> Dataset:
    classes, codes = np.unique(labels, return_inverse=True)
    pyclasses = [c.item() if isinstance(c, np.generic) else c for c in classes]
    return Dataset(name, X, codes.astype(np.int64), "classification", tuple(names),
                   classes=pyclasses, **kw)


def _load_sklearn(name: str) -> Dataset:
    from sklearn import datasets as skd

    loader = {
        "diabetes": skd.load_diabetes,
        "breast_cancer": skd.load_breast_cancer,
        "wine": skd.load_wine,
    }[name]
    bunch = loader()
    X = np.asarray(bunch.data, dtype=np.float64)
    names = [str(s) for s in bunch.feature_names]
    if name == "diabetes":
        return Dataset(name, X, np.asarray(bunch.target, np.float64), "regression", tuple(names))
    target = np.asarray(bunch.target, dtype=np.int64)
    return Dataset(name, X, target, "classification", tuple(names),
                   classes=[str(s) for s in bunch.target_names])


def _load_pmlb(name: str, file: str, task: Task) -> Dataset:
    names, data = _read_table(_data_file("pmlb", file), delimiter="\t", header=True)
    assert names is not None
    if "target" not in names:
        raise ValueError(f"{file}: no 'target' column")
    t = names.index("target")
    feats = [c for i, c in enumerate(names) if i != t]
    X = np.delete(data, t, axis=1)
    if task == "regression":
        return Dataset(name, X, data[:, t], "regression", tuple(feats))
    return _classification(name, X, data[:, t].astype(np.int64), feats)


def _load_kin8nm() -> Dataset:
    _, data = _read_table(_data_file("kin8nm", "kin8nm.csv"), delimiter=",", header=False)
    feats = [f"x{i}" for i in range(1, data.shape[1])]
    return Dataset("kin8nm", data[:, :-1], data[:, -1], "regression", tuple(feats))


def _load_space_ga() -> Dataset:
    names, data = _read_table(_data_file("space_ga", "space_ga.csv"), delimiter=",", header=True)
    assert names is not None
    t = names.index("ln")
    feats = [c for i, c in enumerate(names) if i != t]
    return Dataset("space_ga", np.delete(data, t, axis=1), data[:, t], "regression",
                   tuple(feats))


def _load_banknote() -> Dataset:
    path = _data_file("banknote", "data_banknote_authentication.txt")
    _, data = _read_table(path, delimiter=",", header=False)
    feats = ["variance", "skewness", "curtosis", "entropy"]
    return _classification("banknote", data[:, :4], data[:, 4].astype(np.int64), feats)


def _read_madelon(stem: str) -> tuple[FloatArray, NDArray[np.int64]]:
    data_path = _data_file("madelon", f"madelon_{stem}.data")
    labels_path = _data_file("madelon", f"madelon_{stem}.labels")
    labels = np.loadtxt(labels_path, dtype=np.int64, ndmin=1)
    values = np.array(data_path.read_text(encoding="ascii").split(), dtype=np.float64)
    if values.size != labels.size * 500:
        raise ValueError(f"{data_path}: expected {labels.size} rows of 500 features")
    if not np.isin(labels, (-1, 1)).all():
        raise ValueError(f"{labels_path}: labels must be -1 or +1")
    return values.reshape(labels.size, 500), labels


def _load_madelon() -> Dataset:
    X_tr, y_tr = _read_madelon("train")
    X_va, y_va = _read_madelon("valid")
    X = np.vstack([X_tr, X_va])
    y = np.concatenate([y_tr, y_va])
    feats = [f"x{i}" for i in range(1, 501)]
    # classes [-1, 1] -> codes 0, 1
    return _classification("madelon", X, y, feats)


# --------------------------------------------------------------------------------------------
# Fed-Heart-Disease (FLamby)
# --------------------------------------------------------------------------------------------

#: Hospital index used by FLamby (and as the ``client`` column).
HEART_CENTERS: tuple[str, ...] = ("cleveland", "hungarian", "switzerland", "va")
HEART_FEATURES: tuple[str, ...] = (
    "age", "sex", "trestbps", "chol", "fbs", "thalach", "exang", "oldpeak",
    "cp_2", "cp_3", "cp_4", "restecg_1", "restecg_2",
)
_HEART_TRAIN_FRACTION = 0.66
_HEART_SPLIT_SEED = 43


def _read_heart_center(center: str) -> tuple[FloatArray, IntArray]:
    """One hospital's rows after FLamby's cleaning: features (13 columns) and binary labels."""
    path = _data_file("heart_disease", f"processed.{center}.data")
    rows: list[list[float]] = []
    for lineno, line in enumerate(path.read_text(encoding="ascii").splitlines(), 1):
        if not line.strip():
            continue
        fields = line.strip().split(",")
        if len(fields) != 14:
            raise ValueError(f"{path}:{lineno}: expected 14 fields, got {len(fields)}")
        kept = [f for j, f in enumerate(fields) if j not in (10, 11, 12)]  # slope, ca, thal
        if "?" in kept:
            continue  # FLamby: replace '?' by NaN, then dropna over the 11 kept columns
        rows.append([float(f) for f in kept])
    raw = np.asarray(rows, dtype=np.float64)
    # kept columns: 0 age, 1 sex, 2 cp, 3 trestbps, 4 chol, 5 fbs, 6 restecg, 7 thalach,
    #               8 exang, 9 oldpeak, 10 num
    cp, restecg, num = raw[:, 2], raw[:, 6], raw[:, 10]
    if not np.isin(cp, (1, 2, 3, 4)).all() or not np.isin(restecg, (0, 1, 2)).all():
        raise ValueError(f"{path}: unexpected cp / restecg levels")
    plain = raw[:, [0, 1, 3, 4, 5, 7, 8, 9]]
    dummies = np.column_stack(
        [cp == 2, cp == 3, cp == 4, restecg == 1, restecg == 2]
    ).astype(np.float64)
    X = np.hstack([plain, dummies])
    y = (num > 0).astype(np.int64)
    return X, y


def _heart_split(y: IntArray) -> tuple[IntArray, IntArray]:
    """FLamby's per-center split; returns sorted train and test row indices."""
    from sklearn.model_selection import train_test_split

    levels, counts = np.unique(y, return_counts=True)
    stratify = y if (levels.size > 1 and bool(np.all(counts > 2))) else None
    idx_train, idx_test = train_test_split(
        np.arange(y.size),
        test_size=1.0 - _HEART_TRAIN_FRACTION,
        train_size=_HEART_TRAIN_FRACTION,
        random_state=_HEART_SPLIT_SEED,
        shuffle=True,
        stratify=stratify,
    )
    return np.sort(idx_train).astype(np.int64), np.sort(idx_test).astype(np.int64)


def _heart_centers() -> list[tuple[FloatArray, IntArray]]:
    return [_read_heart_center(c) for c in HEART_CENTERS]


def _load_heart_pooled() -> Dataset:
    parts = _heart_centers()
    X = np.vstack([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    client = np.concatenate([np.full(p[1].size, k, np.int64) for k, p in enumerate(parts)])
    return Dataset("heart_disease", X, y, "classification", HEART_FEATURES, client=client,
                   classes=[0, 1])


def load_fed_heart_disease() -> TrainTest:
    """Fed-Heart-Disease with FLamby's per-hospital train/test split.

    Reproduces ``flamby.datasets.fed_heart_disease.HeartDiseaseRaw``: for each of the four UCI
    files (Cleveland, Hungary, Switzerland, Long Beach VA; client 0..3 in FLamby's numbering),
    drop columns 10-12 (slope, ca, thal), drop rows with a missing value (303/261/46/130 rows),
    binarise the target (``num > 0``), then split the hospital's rows with
    ``train_test_split(test_size=1 - 0.66, train_size=0.66, random_state=43, shuffle=True)``,
    stratified on the label when both classes have more than 2 rows (all hospitals except
    Switzerland). Train/test sizes: 199/104, 172/89, 30/16, 85/45. Used in Section 5, "Real data".

    Returns
    -------
    TrainTest
        ``train`` and ``test`` datasets (13 features, ``client`` = hospital index, rows ordered
        by hospital, then by file order within a hospital).

    Notes
    -----
    Features: age, sex, trestbps, chol, fbs, thalach, exang, oldpeak, then one-hot ``cp``
    (levels 2, 3, 4; level 1 dropped) and ``restecg`` (levels 1, 2; level 0 dropped) -- the 13
    clinical covariates of the paper. FLamby itself ends up with 16 columns: pandas reads
    ``restecg`` as text in the two files where it has a ``?``, so ``get_dummies`` sees "0" and
    0.0 as different levels. The extra columns only duplicate the restecg information per file
    type; the split (row selection) is unaffected, and this loader keeps the clean 13-column
    encoding.
    """
    trains_X, trains_y, trains_c, tests_X, tests_y, tests_c = [], [], [], [], [], []
    for k, (X, y) in enumerate(_heart_centers()):
        tr, te = _heart_split(y)
        trains_X.append(X[tr])
        trains_y.append(y[tr])
        trains_c.append(np.full(tr.size, k, np.int64))
        tests_X.append(X[te])
        tests_y.append(y[te])
        tests_c.append(np.full(te.size, k, np.int64))

    def make(Xs: list[FloatArray], ys: list[IntArray], cs: list[IntArray]) -> Dataset:
        return Dataset("heart_disease", np.vstack(Xs), np.concatenate(ys), "classification",
                       HEART_FEATURES, client=np.concatenate(cs), classes=[0, 1])

    return TrainTest(make(trains_X, trains_y, trains_c), make(tests_X, tests_y, tests_c))


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    info: DatasetInfo
    loader: Callable[[], Dataset] = field(repr=False)


def _spec(name: str, task: Task, shared: bool, desc: str, loader: Callable[[], Dataset]) -> _Spec:
    return _Spec(DatasetInfo(name, task, shared, desc), loader)


_REGISTRY: dict[str, _Spec] = {
    s.info.name: s
    for s in [
        _spec("diabetes", "regression", False, "scikit-learn, 442 x 10",
              lambda: _load_sklearn("diabetes")),
        _spec("breast_cancer", "classification", False,
              "scikit-learn (Wisconsin diagnostic), 569 x 30, 2 classes",
              lambda: _load_sklearn("breast_cancer")),
        _spec("wine", "classification", False, "scikit-learn, 178 x 13, 3 classes",
              lambda: _load_sklearn("wine")),
        _spec("bodyfat", "regression", True, "PMLB 560_bodyfat, 252 x 14",
              lambda: _load_pmlb("bodyfat", "560_bodyfat.tsv.gz", "regression")),
        _spec("space_ga", "regression", True, "StatLib space_ga, 3107 x 6",
              _load_space_ga),
        _spec("puma8NH", "regression", True, "PMLB 225_puma8NH, 8192 x 8",
              lambda: _load_pmlb("puma8NH", "225_puma8NH.tsv.gz", "regression")),
        _spec("cpu_act", "regression", True, "PMLB 197_cpu_act, 8192 x 21",
              lambda: _load_pmlb("cpu_act", "197_cpu_act.tsv.gz", "regression")),
        _spec("kin8nm", "regression", True, "Delve kin8nm, 8192 x 8", _load_kin8nm),
        _spec("spectf", "classification", True, "PMLB spectf, 349 x 44, 2 classes",
              lambda: _load_pmlb("spectf", "spectf.tsv.gz", "classification")),
        _spec("madelon", "classification", True,
              "UCI madelon train+valid, 2600 x 500, labels -1/+1 -> 0/1", _load_madelon),
        _spec("banknote", "classification", True, "UCI banknote authentication, 1372 x 4",
              _load_banknote),
        _spec("heart_disease", "classification", True,
              "UCI/FLamby Fed-Heart-Disease pooled, 740 x 13, client = hospital 0..3",
              _load_heart_pooled),
    ]
}


def available_datasets(*, present_only: bool = False) -> list[DatasetInfo]:
    """List the names :func:`load_dataset` accepts.

    Parameters
    ----------
    present_only : bool, default False
        If True, leave out the datasets that need the shared data directory when it is missing.

    Returns
    -------
    list of DatasetInfo
        In registry order; ``needs_shared_data`` marks the ones read from ``../shared/data``.
    """
    infos = [s.info for s in _REGISTRY.values()]
    if present_only:
        try:
            shared_data_dir()
        except DataNotFoundError:
            infos = [i for i in infos if not i.needs_shared_data]
    return infos


def _canonical(name: str) -> str:
    key = name.strip().replace("-", "_")
    for known in _REGISTRY:
        if known.lower() == key.lower():
            return known
    aliases = {"197_cpu_act": "cpu_act", "bank_note": "banknote", "fed_heart_disease":
               "heart_disease", "heart": "heart_disease", "560_bodyfat": "bodyfat",
               "225_puma8nh": "puma8NH"}
    if key.lower() in aliases:
        return aliases[key.lower()]
    raise ValueError(
        f"unknown dataset {name!r}; available: {', '.join(_REGISTRY)}"
    )


def load_dataset(name: str) -> Dataset:
    """Load a dataset of the paper's benchmark by name.

    Parameters
    ----------
    name : str
        One of ``diabetes``, ``breast_cancer``, ``wine`` (scikit-learn) or ``bodyfat``,
        ``space_ga``, ``puma8NH``, ``cpu_act`` (PMLB 197_cpu_act), ``kin8nm``, ``spectf``,
        ``madelon`` (train + validation, labels -1/+1 as codes 0/1), ``banknote``,
        ``heart_disease`` (the 740 rows of Fed-Heart-Disease pooled, ``client`` = hospital;
        see :func:`load_fed_heart_disease`). Case and ``-``/``_`` are not significant.

    Returns
    -------
    Dataset

    Raises
    ------
    ValueError
        For an unknown name (the message lists the available ones).
    DataNotFoundError
        If the dataset needs the shared data directory and it (or the file) is missing.
    """
    if not isinstance(name, str):
        raise TypeError(f"dataset name must be a str, got {type(name).__name__}")
    return _REGISTRY[_canonical(name)].loader()


# --------------------------------------------------------------------------------------------
# Partitions
# --------------------------------------------------------------------------------------------


def _rng(seed: SeedLike) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer)):
        raise TypeError(f"seed must be an int, a numpy Generator or None, got {seed!r}")
    return np.random.default_rng(seed)


def _check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _groups(values: NDArray[Any], n_groups: int, rng: np.random.Generator) -> IntArray:
    """Group rows for the Dirichlet allocation (see :func:`dirichlet_partition`)."""
    n = values.shape[0]
    if values.ndim == 1:
        if values.dtype.kind in "iubUSO":
            _, inv = np.unique(values, return_inverse=True)
            return inv.astype(np.int64)
        v = values.astype(np.float64)
        if not np.all(np.isfinite(v)):
            raise ValueError("y_or_X contains non-finite values")
        rank = np.empty(n, np.int64)
        rank[np.argsort(v, kind="stable")] = np.arange(n)
        groups: IntArray = (rank * n_groups) // n
        return groups
    X = values.astype(np.float64)
    if not np.all(np.isfinite(X)):
        raise ValueError("y_or_X contains non-finite values")
    sd = X.std(axis=0)
    Z = (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
    k = min(n_groups, np.unique(Z, axis=0).shape[0])
    if k <= 1:
        return np.zeros(n, np.int64)
    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=k, n_init=3, random_state=int(rng.integers(2**31 - 1)))
    labels: IntArray = np.asarray(km.fit_predict(Z), dtype=np.int64)
    return labels


def dirichlet_partition(
    y_or_X: ArrayLike,
    n_clients: int,
    alpha: float,
    rng: SeedLike,
    *,
    n_groups: int = 10,
    min_size: int = 2,
) -> IntArray:
    """Split rows over clients with a Dirichlet allocation (appendix "Benchmark on Public Data").

    The paper partitions each public dataset over ``K = 20`` clients "using a Dirichlet
    allocation" whose concentration ``alpha`` controls heterogeneity (0.1: strongly non-i.i.d.,
    pronounced covariate shift; 10: close to i.i.d.). Scheme used here:

    1. Rows are put into groups of similar rows:

       * ``X`` (2-D): k-means with ``n_groups`` clusters on the standardised features, so
         clients differ in their covariate distribution (covariate shift);
       * ``y`` of integer / bool / string dtype (1-D): one group per class (the label-skew
         scheme of Hsu et al., 2019);
       * ``y`` of float dtype (1-D): ``n_groups`` equal-count bins of the sorted values.

    2. For each group independently, client proportions ``p ~ Dir(alpha * 1_K)`` are drawn and
       the group's rows (in random order) are dealt to clients by a multinomial draw with
       probabilities ``p``. Small ``alpha`` puts each group almost entirely on one or two
       clients; large ``alpha`` spreads every group evenly.
    3. Any client left with fewer than ``min_size`` rows takes random rows from the currently
       largest client until it has ``min_size``.

    Parameters
    ----------
    y_or_X : array-like of shape (n_samples,) or (n_samples, n_features)
        Labels / targets or features that define the groups.
    n_clients : int
        Number of clients ``K``.
    alpha : float
        Dirichlet concentration, ``> 0``.
    rng : int, numpy.random.Generator or None
        Seed or generator.
    n_groups : int, default 10
        Number of k-means clusters (2-D input) or target bins (float 1-D input).
    min_size : int, default 2
        Minimum number of rows per client; ``n_samples >= n_clients * min_size`` is required.

    Returns
    -------
    ndarray of shape (n_samples,), int64
        Client index ``0..n_clients-1`` of each row (every row in exactly one client).
    """
    values = np.asarray(y_or_X)
    if values.ndim not in (1, 2):
        raise ValueError(f"y_or_X must be 1-D or 2-D, got shape {values.shape}")
    n = values.shape[0]
    K = _check_int(n_clients, "n_clients", 1)
    n_groups = _check_int(n_groups, "n_groups", 1)
    min_size = _check_int(min_size, "min_size", 0)
    if isinstance(alpha, bool) or not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
    if n < K * max(min_size, 1):
        raise ValueError(
            f"{n} rows cannot give {K} clients at least {max(min_size, 1)} rows each"
        )
    gen = _rng(rng)
    groups = _groups(values, n_groups, gen)
    client = np.empty(n, np.int64)
    for g in np.unique(groups):
        rows = gen.permutation(np.flatnonzero(groups == g))
        p = gen.dirichlet(np.full(K, float(alpha)))
        if not np.all(np.isfinite(p)) or p.sum() <= 0:  # underflow for tiny alpha
            p = np.zeros(K)
            p[gen.integers(K)] = 1.0
        counts = gen.multinomial(rows.size, p / p.sum())
        client[rows] = np.repeat(np.arange(K, dtype=np.int64), counts)
    sizes = np.bincount(client, minlength=K)
    while (small := np.flatnonzero(sizes < min_size)).size:
        k = int(small[0])
        donor = int(np.argmax(sizes))
        need = int(min(min_size - sizes[k], sizes[donor] - min_size))
        moved = gen.choice(np.flatnonzero(client == donor), size=need, replace=False)
        client[moved] = k
        sizes[k] += need
        sizes[donor] -= need
    return client


def even_partition(n: int, n_clients: int, rng: SeedLike) -> IntArray:
    """Deal ``n`` rows at random into ``n_clients`` shards of equal size (+-1).

    Used for the Banknote fragmentation table (appendix "Performance in Highly Fragmented
    Settings", ``K = 1, 2, 5, 10, 20, 50, 100``).

    Parameters
    ----------
    n : int
        Number of rows.
    n_clients : int
        Number of clients, ``1 <= n_clients <= n``.
    rng : int, numpy.random.Generator or None
        Seed or generator.

    Returns
    -------
    ndarray of shape (n,), int64
        Client index of each row; client sizes differ by at most one.
    """
    n = _check_int(n, "n", 1)
    K = _check_int(n_clients, "n_clients", 1)
    if K > n:
        raise ValueError(f"n_clients={K} exceeds the number of rows n={n}")
    perm = _rng(rng).permutation(n)
    client = np.empty(n, np.int64)
    for k, chunk in enumerate(np.array_split(perm, K)):
        client[chunk] = k
    return client


# --------------------------------------------------------------------------------------------
# Synthetic settings
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class TreeFunction:
    """A regression function given by a fitted CART tree (picklable callable).

    Attributes
    ----------
    tree : sklearn.tree.DecisionTreeRegressor
        The fitted tree.
    d : int
        Input dimension.
    """

    tree: Any
    d: int

    def __call__(self, X: ArrayLike) -> FloatArray:
        """Evaluate ``f`` on the rows of ``X`` (shape ``(n, d)``)."""
        arr = np.asarray(X, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[1] != self.d:
            raise ValueError(f"X must have shape (n, {self.d}), got {arr.shape}")
        return np.asarray(self.tree.predict(arr), dtype=np.float64)


def _aux_target(x_tilde: FloatArray) -> FloatArray:
    """``y_aux = sum_j psi_{j mod 3}(x~_j, x~)`` with the paper's 1-based ``j``.

    0-based column ``i`` is the paper's ``j = i + 1``: component ``(i + 1) mod 3`` and, for the
    interaction, partner column ``(j mod d) + 1`` (1-based) = ``(i + 1) mod d`` (0-based).
    """
    d = x_tilde.shape[1]
    y = np.zeros(x_tilde.shape[0])
    for i in range(d):
        z = x_tilde[:, i]
        kind = (i + 1) % 3
        if kind == 0:
            y += (z > 0.5).astype(np.float64)  # psi_0: step
        elif kind == 1:
            y += np.sin(4.0 * np.pi * z)  # psi_1: frequency
        else:
            y += z * x_tilde[:, (i + 1) % d]  # psi_2: interaction with the next coordinate
    return y


@lru_cache(maxsize=16)
def _tree_distilled_f(d: int, seed: int, n_aux: int) -> TreeFunction:
    from sklearn.tree import DecisionTreeRegressor

    rng = np.random.default_rng(seed)
    x_aux = rng.uniform(-10.0, 10.0, size=(n_aux, d))
    x_tilde = (x_aux + 10.0) / 20.0
    y_aux = _aux_target(x_tilde)
    tree = DecisionTreeRegressor(max_depth=8, random_state=seed).fit(x_aux, y_aux)
    return TreeFunction(tree, d)


def tree_distilled_f(d: int = 20, seed: int = 0, *, n_aux: int = 10_000) -> TreeFunction:
    """The tree-distilled ground truth ``f`` of the synthetic experiments.

    Appendix "Experimental Setting and Additional Simulations", "Definition of the regression
    function f": draw ``N_aux = 10,000`` points ``x_aux ~ Unif([-10, 10]^d)``, rescale them to
    ``x~ = (x_aux + 10) / 20 in [0, 1]^d``, set
    ``y_aux = sum_{j=1}^d psi_{j mod 3}(x~_j, x~)`` with ``psi_0(z) = 1{z > 0.5}``,
    ``psi_1(z) = sin(4 pi z)`` and ``psi_2(z, x~) = x~_j * x~_{(j mod d) + 1}`` (``j`` 1-based,
    so ``x~_d`` interacts with ``x~_1``), and fit a CART regressor of depth 8 on
    ``(x_aux, y_aux)``. ``f`` takes inputs on the original scale (``x``, not ``x~``).

    Parameters
    ----------
    d : int, default 20
        Input dimension (``d >= 1``).
    seed : int, default 0
        Seed of the auxiliary sample (and of the tree's tie-breaking).
    n_aux : int, default 10000
        Auxiliary sample size.

    Returns
    -------
    TreeFunction
        Callable ``f(X) -> (n,)`` float64, picklable; cached per ``(d, seed, n_aux)``.
    """
    d = _check_int(d, "d", 1)
    seed = _check_int(seed, "seed", 0)
    n_aux = _check_int(n_aux, "n_aux", 2)
    return _tree_distilled_f(d, seed, n_aux)


#: Parameters of the Section 5 settings: mean shift gamma, covariance scale alpha, offset delta.
SYNTHETIC_SETTINGS: dict[str, dict[str, float]] = {
    "homogeneous": {"gamma": 0.0, "alpha": 1.0, "delta": 0.0},
    "covariate_shift": {"gamma": 3.0, "alpha": 0.5, "delta": 0.0},
    "outcome_shift": {"gamma": 0.0, "alpha": 1.0, "delta": 1.5},
    "full": {"gamma": 3.0, "alpha": 0.5, "delta": 1.5},
}


def _signs(n_clients: int) -> FloatArray:
    """``(-1)^k`` for the paper's ``k = 1..K`` (client ``h = k - 1``)."""
    return np.where(np.arange(1, n_clients + 1) % 2 == 0, 1.0, -1.0)


def _hold_out(
    name: str,
    Xs: list[FloatArray],
    ys: list[FloatArray],
    test_size: float,
    rng: np.random.Generator,
    feature_prefix: str = "x",
) -> TrainTest:
    """Hold out ``round(test_size * n_k)`` rows of every client as the test sample."""
    tr_X, tr_y, tr_c, te_X, te_y, te_c = [], [], [], [], [], []
    for k, (X, y) in enumerate(zip(Xs, ys, strict=True)):
        n_k = y.size
        n_test = int(round(test_size * n_k))
        if not 1 <= n_test <= n_k - 1:
            raise ValueError(
                f"test_size={test_size} leaves an empty train or test part for {n_k} rows"
            )
        perm = rng.permutation(n_k)
        te, tr = np.sort(perm[:n_test]), np.sort(perm[n_test:])
        tr_X.append(X[tr])
        tr_y.append(y[tr])
        tr_c.append(np.full(tr.size, k, np.int64))
        te_X.append(X[te])
        te_y.append(y[te])
        te_c.append(np.full(te.size, k, np.int64))
    d = Xs[0].shape[1]
    names = tuple(f"{feature_prefix}{j}" for j in range(1, d + 1))

    def make(X: list[FloatArray], y: list[FloatArray], c: list[IntArray]) -> Dataset:
        return Dataset(name, np.vstack(X), np.concatenate(y), "regression", names,
                       client=np.concatenate(c))

    return TrainTest(make(tr_X, tr_y, tr_c), make(te_X, te_y, te_c))


def _check_fraction(value: float, name: str, *, closed: bool) -> float:
    ok = np.isfinite(value) and (0.0 <= value <= 1.0 if closed else 0.0 < value < 1.0)
    if isinstance(value, bool) or not ok:
        interval = "[0, 1]" if closed else "(0, 1)"
        raise ValueError(f"{name} must lie in {interval}, got {value!r}")
    return float(value)


def _check_nonneg(value: float, name: str, *, strict: bool = False) -> float:
    if isinstance(value, bool) or not np.isfinite(value) or value < 0 or (strict and value == 0):
        bound = "> 0" if strict else ">= 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def make_federated_regression(
    setting: str = "homogeneous",
    n_clients: int = 10,
    n_per_client: int = 200,
    d: int = 20,
    seed: SeedLike = 0,
    *,
    gamma: float | None = None,
    alpha: float | None = None,
    delta: float | None = None,
    noise_var: float = 0.5,
    test_size: float = 0.3,
    f: Callable[[FloatArray], FloatArray] | None = None,
    f_seed: int = 0,
) -> TrainTest:
    """The synthetic multicentre regression of Section 5 "Numerical Results".

    Client ``k = 1..K`` draws ``n_per_client`` rows ``X ~ N(mu_k, alpha_k I_d)`` with
    ``mu_k = (-1)^k gamma (1, ..., 1)`` and ``Y = f(X) + delta_k + eps``, ``delta_k = (-1)^k
    delta``, ``eps ~ N(0, noise_var)``; ``f`` is :func:`tree_distilled_f`. Settings:

    ================  =====  =====  =====
    setting           gamma  alpha  delta
    ================  =====  =====  =====
    homogeneous       0      1      0
    covariate_shift   3      0.5    0
    outcome_shift     0      1      1.5
    full              3      0.5    1.5    (appendix "Covariate and outcome shifts")
    ================  =====  =====  =====

    ``alpha`` is the variance of each coordinate (the paper's covariance ``alpha_k I_d``). The
    paper writes the noise as ``N(0, .5)``; following the ``N(mean, variance)`` convention of
    the same sentence, ``noise_var = 0.5`` is a variance (standard deviation ``sqrt(0.5)``).
    Caveat: the appendix's outlier table reports test MSEs of 0.46-0.48 for the homogeneous
    setting, below the 0.5 floor this implies on noisy test labels; that fits a standard
    deviation of 0.5 (``noise_var=0.25``) or a noise-free test target equally well.
    As in the paper, ``test_size = 30%`` of the generated rows are held out as a test sample
    from the client mixture; the hold-out is stratified by client (``round(0.3 * n_k)`` rows of
    each client), so with the defaults each client trains on 140 rows and the test set has 600.

    Parameters
    ----------
    setting : {"homogeneous", "covariate_shift", "outcome_shift", "full"}
        Heterogeneity regime.
    n_clients : int, default 10
        ``K``.
    n_per_client : int, default 200
        Rows generated per client (before the hold-out).
    d : int, default 20
        Dimension.
    seed : int, numpy.random.Generator or None, default 0
        Seed of the draw (features, noise, hold-out).
    gamma, alpha, delta : float, optional
        Override the setting's mean shift, covariance scale and outcome offset.
    noise_var : float, default 0.5
        Variance of ``eps``.
    test_size : float, default 0.3
        Held-out fraction of each client's rows, in (0, 1).
    f : callable, optional
        Regression function ``(n, d) -> (n,)``; default ``tree_distilled_f(d, f_seed)``, fixed
        across draws (only the data change with ``seed``).
    f_seed : int, default 0
        Seed of the default ``f``.

    Returns
    -------
    TrainTest
        Regression datasets named after the setting, ``client`` = ``k - 1``, features
        ``x1..xd``; rows are grouped by client.
    """
    if setting not in SYNTHETIC_SETTINGS:
        raise ValueError(
            f"unknown setting {setting!r}; choose one of {', '.join(SYNTHETIC_SETTINGS)}"
        )
    params = dict(SYNTHETIC_SETTINGS[setting])
    for key, value in (("gamma", gamma), ("alpha", alpha), ("delta", delta)):
        if value is not None:
            params[key] = float(value)
    g = _check_nonneg(params["gamma"], "gamma")
    a = _check_nonneg(params["alpha"], "alpha", strict=True)
    dl = _check_nonneg(params["delta"], "delta")
    K = _check_int(n_clients, "n_clients", 1)
    n_k = _check_int(n_per_client, "n_per_client", 2)
    d = _check_int(d, "d", 1)
    noise_sd = np.sqrt(_check_nonneg(noise_var, "noise_var"))
    test_size = _check_fraction(test_size, "test_size", closed=False)
    func = f if f is not None else tree_distilled_f(d, f_seed)
    rng = _rng(seed)
    signs = _signs(K)
    Xs: list[FloatArray] = []
    ys: list[FloatArray] = []
    for k in range(K):
        X = signs[k] * g + np.sqrt(a) * rng.standard_normal((n_k, d))
        y = np.asarray(func(X), np.float64) + signs[k] * dl + noise_sd * rng.standard_normal(n_k)
        Xs.append(X)
        ys.append(y)
    return _hold_out(setting, Xs, ys, test_size, rng)


def make_disjoint_supports(
    gamma: float,
    n_per_client: int = 150,
    d: int = 5,
    seed: SeedLike = 0,
    *,
    sigma: float = 1.0,
    test_size: float = 0.3,
) -> TrainTest:
    """Two clients with (nearly) disjoint supports along ``x1``.

    Appendix "Covariate shift: when local objectives mis-rank global splits", "Disjoint
    supports": ``K = 2`` clients, ``X ~ N(mu_k, I_d)`` with ``mu_k = ((-1)^k gamma, 0, ..., 0)``,
    ``Y = 10 * 1{x1 > 0} + eps``, ``eps ~ N(0, sigma^2)``, ``sigma = 1`` (irreducible MSE 1).
    Client 0 (``k = 1``) is centred at ``-gamma``, client 1 at ``+gamma``. A fraction
    ``test_size`` of each client's rows is held out, as in :func:`make_federated_regression`.

    Parameters
    ----------
    gamma : float
        Gap parameter, ``>= 0`` (the paper uses 0, 1, 2.5, 5).
    n_per_client : int, default 150
        Rows generated per client (before the hold-out).
    d : int, default 5
        Dimension.
    seed : int, numpy.random.Generator or None, default 0
        Seed.
    sigma : float, default 1.0
        Noise standard deviation.
    test_size : float, default 0.3
        Held-out fraction of each client's rows.

    Returns
    -------
    TrainTest
    """
    g = _check_nonneg(gamma, "gamma")
    n_k = _check_int(n_per_client, "n_per_client", 2)
    d = _check_int(d, "d", 1)
    s = _check_nonneg(sigma, "sigma")
    test_size = _check_fraction(test_size, "test_size", closed=False)
    rng = _rng(seed)
    Xs: list[FloatArray] = []
    ys: list[FloatArray] = []
    for sign in _signs(2):
        X = rng.standard_normal((n_k, d))
        X[:, 0] += sign * g
        Xs.append(X)
        ys.append(10.0 * (X[:, 0] > 0) + s * rng.standard_normal(n_k))
    return _hold_out("disjoint_supports", Xs, ys, test_size, rng)


def make_overlapping_supports(
    gamma: float,
    n_per_client: int = 150,
    d: int = 5,
    seed: SeedLike = 0,
    *,
    sigma: float = 1.0,
    sigma_x: float = 1.5,
    test_size: float = 0.3,
) -> TrainTest:
    """Two overlapping clients where the heterogeneity term misleads averaged impurities.

    Appendix "Covariate shift: when local objectives mis-rank global splits", "Overlapping
    supports": ``K = 2`` clients, ``X ~ N(mu_k 1_d, sigma_x^2 I_d)`` with ``mu_k in {-gamma,
    +gamma}`` (client 0 at ``-gamma``, client 1 at ``+gamma``; the scalar mean is applied to
    every coordinate) and ``sigma_x = 1.5``; ``Y = x1 + eps``, ``eps ~ N(0, sigma^2)``. The
    paper leaves ``sigma`` unstated; 1 matches the disjoint-supports experiment. A fraction
    ``test_size`` of each client's rows is held out.

    Parameters
    ----------
    gamma : float
        Mean shift, ``>= 0``.
    n_per_client : int, default 150
        Rows generated per client (before the hold-out).
    d : int, default 5
        Dimension.
    seed : int, numpy.random.Generator or None, default 0
        Seed.
    sigma : float, default 1.0
        Noise standard deviation.
    sigma_x : float, default 1.5
        Feature standard deviation.
    test_size : float, default 0.3
        Held-out fraction of each client's rows.

    Returns
    -------
    TrainTest
    """
    g = _check_nonneg(gamma, "gamma")
    n_k = _check_int(n_per_client, "n_per_client", 2)
    d = _check_int(d, "d", 1)
    s = _check_nonneg(sigma, "sigma")
    sx = _check_nonneg(sigma_x, "sigma_x", strict=True)
    test_size = _check_fraction(test_size, "test_size", closed=False)
    rng = _rng(seed)
    Xs: list[FloatArray] = []
    ys: list[FloatArray] = []
    for sign in _signs(2):
        X = sign * g + sx * rng.standard_normal((n_k, d))
        Xs.append(X)
        ys.append(X[:, 0] + s * rng.standard_normal(n_k))
    return _hold_out("overlapping_supports", Xs, ys, test_size, rng)


def contaminate_outliers(
    X: ArrayLike, fraction: float, rng: SeedLike, *, factor: float = 1000.0
) -> tuple[FloatArray, IntArray]:
    """Multiply the feature vectors of a random fraction of rows by ``factor``.

    Appendix "Robustness to outliers": in the homogeneous setting, ``0%`` to ``20%`` of the
    training rows have their feature vectors multiplied by 1000; targets are left unchanged.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Training features (not modified).
    fraction : float
        Fraction of rows to contaminate, in [0, 1]; exactly ``round(fraction * n_samples)`` rows
        are chosen, uniformly without replacement.
    rng : int, numpy.random.Generator or None
        Seed or generator.
    factor : float, default 1000.0
        Multiplier.

    Returns
    -------
    X_out : ndarray of shape (n_samples, n_features), float64
        A contaminated copy of ``X``.
    rows : ndarray, int64
        Sorted indices of the contaminated rows.
    """
    arr = np.array(X, dtype=np.float64, copy=True)
    if arr.ndim != 2:
        raise ValueError(f"X must be 2-D, got shape {arr.shape}")
    frac = _check_fraction(fraction, "fraction", closed=True)
    if isinstance(factor, bool) or not np.isfinite(factor):
        raise ValueError(f"factor must be a finite number, got {factor!r}")
    n = arr.shape[0]
    n_out = int(round(frac * n))
    rows = np.sort(_rng(rng).choice(n, size=n_out, replace=False)).astype(np.int64)
    arr[rows] *= factor
    return arr, rows
