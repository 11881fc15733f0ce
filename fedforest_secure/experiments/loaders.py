"""Real datasets by name: scikit-learn's and the paper's benchmark sets in ``../shared/data``.

:func:`load_dataset` loads the three scikit-learn datasets (``diabetes``, ``breast_cancer``,
``wine``) and the offline copies of the paper's benchmark sets (``bodyfat``, ``space_ga``,
``puma8NH``, ``cpu_act``, ``kin8nm``, ``spectf``, ``madelon``, ``banknote``, ``heart_disease``).
The shared files are read in place, never copied; :func:`shared_data_dir` says where they are
looked for (``$FEDFOREST_DATA_DIR``, else ``../shared/data`` relative to the current working
directory, i.e. next to the project root when run from there). :func:`load_fed_heart_disease`
reproduces FLamby's per-hospital train/test split of Fed-Heart-Disease (Section 5, "Real data").
:func:`available_datasets` lists the names.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import FedForestError
from ._args import FloatArray, IntArray, Task
from .tables import Dataset, DatasetInfo, TrainTest

__all__ = [
    "DATA_DIR_ENV",
    "HEART_CENTERS",
    "HEART_FEATURES",
    "HEART_RAW_FEATURES",
    "DataNotFoundError",
    "available_datasets",
    "canonical_name",
    "load_dataset",
    "load_fed_heart_disease",
    "load_heart_disease_with_missing",
    "shared_data_dir",
]

#: Environment variable that overrides the location of the shared data directory.
DATA_DIR_ENV = "FEDFOREST_DATA_DIR"


class DataNotFoundError(FedForestError, FileNotFoundError):
    """The shared data directory, or a file expected in it, does not exist."""


# --------------------------------------------------------------------------------------------
# Shared data directory and file readers
# --------------------------------------------------------------------------------------------


def shared_data_dir() -> Path:
    """Locate the shared data directory.

    Returns
    -------
    pathlib.Path
        ``$FEDFOREST_DATA_DIR`` if the variable is set and non-empty, else ``../shared/data``
        relative to the current working directory (the project root, where tests, benchmarks
        and CI run).

    Raises
    ------
    DataNotFoundError
        If the directory does not exist (a :class:`FileNotFoundError`); the message names both
        places it is looked for.
    """
    env = os.environ.get(DATA_DIR_ENV, "").strip()
    default = Path.cwd().parent / "shared" / "data"
    path = Path(env).expanduser() if env else default
    if not path.is_dir():
        where = (f"${DATA_DIR_ENV} is set to {env!r}, which is not a directory" if env else
                 f"${DATA_DIR_ENV} is not set and ../shared/data (from the current directory: "
                 f"{default}) does not exist")
        raise DataNotFoundError(
            f"shared data directory not found: {where}. Set ${DATA_DIR_ENV} to the directory "
            "holding heart_disease/, banknote/, pmlb/, ..., run from a project root that has "
            "../shared/data beside it, or use a dataset that ships with scikit-learn "
            "(diabetes, breast_cancer, wine)."
        )
    return path


def _data_file(*parts: str) -> Path:
    path = shared_data_dir().joinpath(*parts)
    if not path.is_file():
        raise DataNotFoundError(f"data file not found: {path}")
    return path


def _read_table(
    path: Path, *, delimiter: str | None, header: bool
) -> tuple[list[str], FloatArray]:
    """Read a numeric delimited text file (optionally gzip-compressed) into float64.

    Returns the header's field names (empty without a header) and the values.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        names: list[str] = []
        if header:
            line = fh.readline().strip()
            names = [s.strip() for s in line.split(delimiter)]
        data = np.loadtxt(fh, delimiter=delimiter, dtype=np.float64, ndmin=2)
    if header and data.shape[1] != len(names):
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


def _heart_records(center: str) -> tuple[Path, list[list[str]]]:
    """One hospital's UCI file and its records (14 fields each, blank lines skipped)."""
    path = _data_file("heart_disease", f"processed.{center}.data")
    records: list[list[str]] = []
    for lineno, line in enumerate(path.read_text(encoding="ascii").splitlines(), 1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.strip().split(",")]
        if len(fields) != 14:
            raise ValueError(f"{path}:{lineno}: expected 14 fields, got {len(fields)}")
        records.append(fields)
    return path, records


def _read_heart_center(center: str) -> tuple[FloatArray, IntArray]:
    """One hospital's rows after FLamby's cleaning: features (13 columns) and binary labels."""
    path, records = _heart_records(center)
    rows: list[list[float]] = []
    for fields in records:
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


#: The 13 clinical attributes of the raw UCI files, in file order (``num`` is the target).
HEART_RAW_FEATURES: tuple[str, ...] = (
    "age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "oldpeak",
    "slope", "ca", "thal",
)


def _read_heart_raw(center: str) -> tuple[FloatArray, IntArray]:
    """One hospital's raw rows: all 13 attributes with ``?`` read as NaN (nothing dropped,
    ``chol = 0`` kept as written), labels ``num > 0``."""
    path, records = _heart_records(center)
    raw = np.asarray([[np.nan if f == "?" else float(f) for f in fields] for fields in records],
                     dtype=np.float64)
    if np.isnan(raw[:, 13]).any():
        raise ValueError(f"{path}: a row without its label")
    return raw[:, :13], (raw[:, 13] > 0).astype(np.int64)


def load_heart_disease_with_missing(seed: int) -> TrainTest:
    """The raw four-hospital Heart Disease data with its missing values: 920 patients, the 13
    attributes of the UCI files (``?`` as NaN: about 15% of the cells, most of ``slope``,
    ``ca`` and ``thal`` at three hospitals), per hospital a stratified 66/34 train/test split
    with ``random_state=seed``. ``client`` = hospital index (FLamby's numbering)."""
    from sklearn.model_selection import train_test_split

    parts: list[tuple[list[FloatArray], list[IntArray], list[IntArray]]] = [
        ([], [], []), ([], [], [])]
    for k, center in enumerate(HEART_CENTERS):
        X, y = _read_heart_raw(center)
        idx_tr, idx_te = train_test_split(np.arange(y.size), train_size=0.66, shuffle=True,
                                          random_state=seed, stratify=y)
        for part, idx in zip(parts, (np.sort(idx_tr), np.sort(idx_te)), strict=True):
            part[0].append(X[idx])
            part[1].append(y[idx])
            part[2].append(np.full(idx.size, k, np.int64))

    def make(Xs: list[FloatArray], ys: list[IntArray], cs: list[IntArray]) -> Dataset:
        return Dataset("heart_disease_raw", np.vstack(Xs), np.concatenate(ys),
                       "classification", HEART_RAW_FEATURES, client=np.concatenate(cs),
                       classes=[0, 1])

    return TrainTest(make(*parts[0]), make(*parts[1]))


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


def canonical_name(name: str) -> str:
    """The registry name :func:`load_dataset` reads for ``name`` (case, ``-``/``_`` and the
    aliases such as ``heart`` are not significant); nothing is read.

    Raises
    ------
    ValueError
        For an unknown name (the message lists the available ones).
    """
    if not isinstance(name, str):
        raise TypeError(f"dataset name must be a str, got {type(name).__name__}")
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
    return _REGISTRY[canonical_name(name)].loader()
