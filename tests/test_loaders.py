"""Tests for fedforest_secure.experiments.loaders (and the Dataset container it returns)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedforest_secure.errors import FedForestError
from fedforest_secure.experiments import loaders
from fedforest_secure.experiments.tables import Dataset

SKLEARN_NAMES = {"diabetes", "breast_cancer", "wine"}
SHARED_NAMES = {
    "bodyfat", "space_ga", "puma8NH", "cpu_act", "kin8nm", "spectf", "madelon", "banknote",
    "heart_disease",
}

# name -> (shape of X, task, number of classes or None); row counts from MANIFEST.tsv
EXPECTED = {
    "diabetes": ((442, 10), "regression", None),
    "breast_cancer": ((569, 30), "classification", 2),
    "wine": ((178, 13), "classification", 3),
    "bodyfat": ((252, 14), "regression", None),
    "space_ga": ((3107, 6), "regression", None),
    "puma8NH": ((8192, 8), "regression", None),
    "cpu_act": ((8192, 21), "regression", None),
    "kin8nm": ((8192, 8), "regression", None),
    "spectf": ((349, 44), "classification", 2),
    "madelon": ((2600, 500), "classification", 2),
    "banknote": ((1372, 4), "classification", 2),
    "heart_disease": ((740, 13), "classification", 2),
}


def _shared_present() -> bool:
    try:
        loaders.shared_data_dir()
    except loaders.DataNotFoundError:
        return False
    return True


needs_shared = pytest.mark.skipif(
    not _shared_present(),
    reason="shared data directory (../shared/data or $FEDFOREST_DATA_DIR) is missing",
)


@pytest.fixture
def missing_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    missing = tmp_path / "nowhere"
    monkeypatch.setenv(loaders.DATA_DIR_ENV, str(missing))
    return missing


# ------------------------------------------------------------------------------------------
# Registry, data directory, errors
# ------------------------------------------------------------------------------------------


def test_available_datasets_lists_and_marks_names() -> None:
    infos = loaders.available_datasets()
    assert {i.name for i in infos} == SKLEARN_NAMES | SHARED_NAMES
    for info in infos:
        assert info.needs_shared_data == (info.name in SHARED_NAMES)
        assert info.task == EXPECTED[info.name][1]


def test_missing_data_dir_gives_clear_file_not_found(missing_data_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match=loaders.DATA_DIR_ENV) as exc:
        loaders.shared_data_dir()
    assert isinstance(exc.value, loaders.DataNotFoundError)
    assert isinstance(exc.value, FedForestError)
    assert str(missing_data_dir) in str(exc.value)
    with pytest.raises(loaders.DataNotFoundError):
        loaders.load_dataset("banknote")
    with pytest.raises(loaders.DataNotFoundError):
        loaders.load_fed_heart_disease()
    # scikit-learn datasets do not need the directory
    assert loaders.load_dataset("wine").n_samples == 178
    present = {i.name for i in loaders.available_datasets(present_only=True)}
    assert present == SKLEARN_NAMES


def test_missing_file_inside_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loaders.DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(loaders.DataNotFoundError, match="kin8nm.csv"):
        loaders.load_dataset("kin8nm")


def test_default_data_dir_is_shared_data_beside_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(loaders.DATA_DIR_ENV, raising=False)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "project").mkdir()
    monkeypatch.chdir(tmp_path / "project")
    assert loaders.shared_data_dir() == tmp_path / "shared" / "data"
    # the variable wins over the default
    monkeypatch.setenv(loaders.DATA_DIR_ENV, str(tmp_path / "project"))
    assert loaders.shared_data_dir() == tmp_path / "project"


def test_missing_default_data_dir_names_both_places(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(loaders.DATA_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(loaders.DataNotFoundError) as exc:
        loaders.shared_data_dir()
    message = str(exc.value)
    assert f"${loaders.DATA_DIR_ENV} is not set" in message
    assert "../shared/data" in message and str(tmp_path.parent / "shared" / "data") in message


def test_unknown_name_lists_available() -> None:
    with pytest.raises(ValueError, match="available: .*breast_cancer.*heart_disease"):
        loaders.load_dataset("iris")
    with pytest.raises(TypeError):
        loaders.load_dataset(3)  # type: ignore[arg-type]


def test_names_are_case_and_dash_insensitive() -> None:
    assert loaders.load_dataset("Breast-Cancer").name == "breast_cancer"


# ------------------------------------------------------------------------------------------
# Loaders
# ------------------------------------------------------------------------------------------


def _check_dataset(ds: Dataset, name: str) -> None:
    shape, task, n_classes = EXPECTED[name]
    assert ds.name == name
    assert ds.X.shape == shape and ds.X.dtype == np.float64
    assert np.isfinite(ds.X).all()
    assert ds.task == task
    assert len(ds.feature_names) == shape[1]
    assert len(set(ds.feature_names)) == shape[1]
    assert ds.y.shape == (shape[0],)
    if task == "regression":
        assert ds.y.dtype == np.float64 and ds.classes is None
        assert np.isfinite(ds.y).all() and ds.y.std() > 0
    else:
        assert ds.y.dtype == np.int64
        assert ds.classes is not None and len(ds.classes) == n_classes
        assert set(np.unique(ds.y)) == set(range(n_classes))


@pytest.mark.parametrize("name", sorted(SKLEARN_NAMES))
def test_sklearn_loaders(name: str) -> None:
    ds = loaders.load_dataset(name)
    _check_dataset(ds, name)
    assert ds.client is None


@needs_shared
@pytest.mark.parametrize("name", sorted(SHARED_NAMES))
def test_shared_loaders(name: str) -> None:
    ds = loaders.load_dataset(name)
    _check_dataset(ds, name)
    if name != "heart_disease":
        assert ds.client is None


@needs_shared
def test_madelon_labels_and_banknote_balance() -> None:
    mad = loaders.load_dataset("madelon")
    assert mad.classes == [-1, 1]
    assert np.bincount(mad.y).tolist() == [1300, 1300]
    assert mad.X[:2000].min() >= 0 and np.all(mad.X == np.round(mad.X))
    bank = loaders.load_dataset("banknote")
    assert np.bincount(bank.y).tolist() == [762, 610]
    assert loaders.load_dataset("space_ga").feature_names[0] == "POP"


@needs_shared
def test_heart_disease_pooled() -> None:
    ds = loaders.load_dataset("heart_disease")
    assert ds.client is not None
    assert np.bincount(ds.client).tolist() == [303, 261, 46, 130]
    assert ds.feature_names == loaders.HEART_FEATURES
    dummies = ds.X[:, 8:]
    assert set(np.unique(dummies)) <= {0.0, 1.0}
    assert (dummies[:, :3].sum(1) <= 1).all() and (dummies[:, 3:].sum(1) <= 1).all()
    # first Cleveland row: 63,1,1(cp),145,233,1,2(restecg),150,0,2.3,...,num 0
    assert ds.X[0].tolist() == [63, 1, 145, 233, 1, 150, 0, 2.3, 0, 0, 0, 0, 1]
    assert ds.y[0] == 0


@needs_shared
def test_fed_heart_disease_matches_flamby_split() -> None:
    train, test = loaders.load_fed_heart_disease()
    assert train.client is not None and test.client is not None
    assert np.bincount(train.client).tolist() == [199, 172, 30, 85]
    assert np.bincount(test.client).tolist() == [104, 89, 16, 45]
    assert train.n_features == test.n_features == 13
    # train and test are disjoint and together give the pooled table, hospital by hospital
    pooled = loaders.load_dataset("heart_disease")
    for k in range(4):
        rows = np.vstack([train.X[train.client == k], test.X[test.client == k]])
        ref = pooled.X[pooled.client == k]
        assert sorted(map(tuple, rows)) == sorted(map(tuple, ref))
    # stratified centers keep the label balance (Cleveland: 139/164 positives overall)
    tr0, te0 = train.y[train.client == 0], test.y[test.client == 0]
    assert abs(tr0.mean() - te0.mean()) < 0.02
    # deterministic
    again = loaders.load_fed_heart_disease()
    assert np.array_equal(again.train.X, train.X) and np.array_equal(again.test.y, test.y)


@needs_shared
def test_raw_heart_disease_keeps_every_row_and_its_missing_values() -> None:
    tt = loaders.load_heart_disease_with_missing(seed=0)
    train, test = tt.train, tt.test
    assert train.client is not None and test.client is not None
    sizes = np.bincount(train.client) + np.bincount(test.client)
    assert sizes.tolist() == [303, 294, 123, 200] and train.n_features == 13
    X = np.vstack([train.X, test.X])
    client = np.concatenate([train.client, test.client])
    assert 0.14 < np.isnan(X).mean() < 0.16
    slope_ca_thal = np.isnan(X[:, 10:13]).mean(axis=0)
    assert (slope_ca_thal > 0.3).all()
    assert (np.isnan(X[client != 0][:, 11]).mean() > 0.9)  # ca: missing outside Cleveland
    # stratified per hospital; another seed, another split
    for k in range(4):
        assert abs(train.y[train.client == k].mean() - test.y[test.client == k].mean()) < 0.03
    other = loaders.load_heart_disease_with_missing(seed=1)
    assert not np.array_equal(np.nan_to_num(other.train.X), np.nan_to_num(train.X))


def test_dataset_validation() -> None:
    X = np.zeros((3, 2))
    with pytest.raises(ValueError, match="2-D"):
        Dataset("t", np.zeros(3), np.zeros(3), "regression", ("a",))
    with pytest.raises(ValueError, match="feature names"):
        Dataset("t", X, np.zeros(3), "regression", ("a",))
    with pytest.raises(ValueError, match="classes"):
        Dataset("t", X, np.zeros(3, int), "classification", ("a", "b"))
    with pytest.raises(ValueError, match="task"):
        Dataset("t", X, np.zeros(3), "ranking", ("a", "b"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="client"):
        Dataset("t", X, np.zeros(3), "regression", ("a", "b"), client=np.zeros(2))
    ds = Dataset("t", X.astype(np.float32), [1, 2, 3], "regression", ["a", "b"])
    assert ds.X.dtype == np.float64 and ds.y.dtype == np.float64
