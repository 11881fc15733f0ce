"""Tests for fedforest_secure.datasets: loaders, partitions and the paper's synthetic settings."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedforest_secure import datasets as D
from fedforest_secure.errors import FedForestError

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
        D.shared_data_dir()
    except D.DataNotFoundError:
        return False
    return True


needs_shared = pytest.mark.skipif(
    not _shared_present(),
    reason="shared data directory (../shared/data or $FEDFOREST_DATA_DIR) is missing",
)


@pytest.fixture
def missing_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    missing = tmp_path / "nowhere"
    monkeypatch.setenv(D.DATA_DIR_ENV, str(missing))
    return missing


# ------------------------------------------------------------------------------------------
# Registry, data directory, errors
# ------------------------------------------------------------------------------------------


def test_available_datasets_lists_and_marks_names() -> None:
    infos = D.available_datasets()
    assert {i.name for i in infos} == SKLEARN_NAMES | SHARED_NAMES
    for info in infos:
        assert info.needs_shared_data == (info.name in SHARED_NAMES)
        assert info.task == EXPECTED[info.name][1]


def test_missing_data_dir_gives_clear_file_not_found(missing_data_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match=D.DATA_DIR_ENV) as exc:
        D.shared_data_dir()
    assert isinstance(exc.value, D.DataNotFoundError)
    assert isinstance(exc.value, FedForestError)
    assert str(missing_data_dir) in str(exc.value)
    with pytest.raises(D.DataNotFoundError):
        D.load_dataset("banknote")
    with pytest.raises(D.DataNotFoundError):
        D.load_fed_heart_disease()
    # scikit-learn datasets do not need the directory
    assert D.load_dataset("wine").n_samples == 178
    present = {i.name for i in D.available_datasets(present_only=True)}
    assert present == SKLEARN_NAMES


def test_missing_file_inside_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(D.DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(D.DataNotFoundError, match="kin8nm.csv"):
        D.load_dataset("kin8nm")


@needs_shared
def test_default_data_dir_is_next_to_project() -> None:
    project_root = Path(D.__file__).resolve().parent.parent
    if os.environ.get(D.DATA_DIR_ENV, "").strip():
        pytest.skip(f"${D.DATA_DIR_ENV} is set")
    assert D.shared_data_dir() == project_root.parent / "shared" / "data"


def test_unknown_name_lists_available() -> None:
    with pytest.raises(ValueError, match="available: .*breast_cancer.*heart_disease"):
        D.load_dataset("iris")
    with pytest.raises(TypeError):
        D.load_dataset(3)  # type: ignore[arg-type]


def test_names_are_case_and_dash_insensitive() -> None:
    assert D.load_dataset("Breast-Cancer").name == "breast_cancer"


# ------------------------------------------------------------------------------------------
# Loaders
# ------------------------------------------------------------------------------------------


def _check_dataset(ds: D.Dataset, name: str) -> None:
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
    ds = D.load_dataset(name)
    _check_dataset(ds, name)
    assert ds.client is None


@needs_shared
@pytest.mark.parametrize("name", sorted(SHARED_NAMES))
def test_shared_loaders(name: str) -> None:
    ds = D.load_dataset(name)
    _check_dataset(ds, name)
    if name != "heart_disease":
        assert ds.client is None


@needs_shared
def test_madelon_labels_and_banknote_balance() -> None:
    mad = D.load_dataset("madelon")
    assert mad.classes == [-1, 1]
    assert np.bincount(mad.y).tolist() == [1300, 1300]
    assert mad.X[:2000].min() >= 0 and np.all(mad.X == np.round(mad.X))
    bank = D.load_dataset("banknote")
    assert np.bincount(bank.y).tolist() == [762, 610]
    assert D.load_dataset("space_ga").feature_names[0] == "POP"


@needs_shared
def test_heart_disease_pooled() -> None:
    ds = D.load_dataset("heart_disease")
    assert ds.client is not None
    assert np.bincount(ds.client).tolist() == [303, 261, 46, 130]
    assert ds.feature_names == D.HEART_FEATURES
    dummies = ds.X[:, 8:]
    assert set(np.unique(dummies)) <= {0.0, 1.0}
    assert (dummies[:, :3].sum(1) <= 1).all() and (dummies[:, 3:].sum(1) <= 1).all()
    # first Cleveland row: 63,1,1(cp),145,233,1,2(restecg),150,0,2.3,...,num 0
    assert ds.X[0].tolist() == [63, 1, 145, 233, 1, 150, 0, 2.3, 0, 0, 0, 0, 1]
    assert ds.y[0] == 0


@needs_shared
def test_fed_heart_disease_matches_flamby_split() -> None:
    train, test = D.load_fed_heart_disease()
    assert train.client is not None and test.client is not None
    assert np.bincount(train.client).tolist() == [199, 172, 30, 85]
    assert np.bincount(test.client).tolist() == [104, 89, 16, 45]
    assert train.n_features == test.n_features == 13
    # train and test are disjoint and together give the pooled table, hospital by hospital
    pooled = D.load_dataset("heart_disease")
    for k in range(4):
        rows = np.vstack([train.X[train.client == k], test.X[test.client == k]])
        ref = pooled.X[pooled.client == k]
        assert sorted(map(tuple, rows)) == sorted(map(tuple, ref))
    # stratified centers keep the label balance (Cleveland: 139/164 positives overall)
    tr0, te0 = train.y[train.client == 0], test.y[test.client == 0]
    assert abs(tr0.mean() - te0.mean()) < 0.02
    # deterministic
    again = D.load_fed_heart_disease()
    assert np.array_equal(again.train.X, train.X) and np.array_equal(again.test.y, test.y)


def test_dataset_validation() -> None:
    X = np.zeros((3, 2))
    with pytest.raises(ValueError, match="2-D"):
        D.Dataset("t", np.zeros(3), np.zeros(3), "regression", ("a",))
    with pytest.raises(ValueError, match="feature names"):
        D.Dataset("t", X, np.zeros(3), "regression", ("a",))
    with pytest.raises(ValueError, match="classes"):
        D.Dataset("t", X, np.zeros(3, int), "classification", ("a", "b"))
    with pytest.raises(ValueError, match="task"):
        D.Dataset("t", X, np.zeros(3), "ranking", ("a", "b"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="client"):
        D.Dataset("t", X, np.zeros(3), "regression", ("a", "b"), client=np.zeros(2))
    ds = D.Dataset("t", X.astype(np.float32), [1, 2, 3], "regression", ["a", "b"])
    assert ds.X.dtype == np.float64 and ds.y.dtype == np.float64
    part = ds.with_client([0, 1, 1]).subset([1, 2])
    assert part.n_samples == 2 and part.n_clients == 2


# ------------------------------------------------------------------------------------------
# Partitions
# ------------------------------------------------------------------------------------------


def _label_heterogeneity(y: np.ndarray, client: np.ndarray) -> float:
    """Mean total-variation distance between client label distributions and the pooled one."""
    classes = np.unique(y)
    glob = np.array([(y == c).mean() for c in classes])
    dists = []
    for k in np.unique(client):
        yk = y[client == k]
        dists.append(0.5 * np.abs(np.array([(yk == c).mean() for c in classes]) - glob).sum())
    return float(np.mean(dists))


def _feature_heterogeneity(X: np.ndarray, client: np.ndarray) -> float:
    """Mean distance between client feature means and the pooled mean (standardised)."""
    Z = (X - X.mean(0)) / X.std(0)
    return float(np.mean([np.linalg.norm(Z[client == k].mean(0)) for k in np.unique(client)]))


def _check_partition(client: np.ndarray, n: int, K: int, min_size: int = 2) -> None:
    assert client.shape == (n,) and client.dtype == np.int64
    assert client.min() >= 0 and client.max() < K
    assert np.bincount(client, minlength=K).min() >= min_size
    assert np.bincount(client, minlength=K).sum() == n  # each row in exactly one client


def test_dirichlet_partition_labels() -> None:
    y = np.random.default_rng(0).integers(0, 3, size=1000)
    het = {}
    for alpha in (0.1, 100.0):
        vals = []
        for seed in range(3):
            client = D.dirichlet_partition(y, 20, alpha, seed)
            _check_partition(client, y.size, 20)
            vals.append(_label_heterogeneity(y, client))
        het[alpha] = np.mean(vals)
    assert het[0.1] > 0.3 > 0.1 > het[100.0]


def test_dirichlet_partition_features_covariate_shift() -> None:
    rng = np.random.default_rng(1)
    X = rng.standard_normal((1200, 5)) @ rng.standard_normal((5, 5))
    small = D.dirichlet_partition(X, 20, 0.1, 0)
    large = D.dirichlet_partition(X, 20, 100.0, 0)
    _check_partition(small, 1200, 20)
    _check_partition(large, 1200, 20)
    assert _feature_heterogeneity(X, small) > 3 * _feature_heterogeneity(X, large)
    # deterministic given the seed, different across seeds
    assert np.array_equal(small, D.dirichlet_partition(X, 20, 0.1, 0))
    assert np.array_equal(small, D.dirichlet_partition(X, 20, 0.1, np.random.default_rng(0)))
    assert not np.array_equal(small, D.dirichlet_partition(X, 20, 0.1, 1))


def test_dirichlet_partition_continuous_target_and_min_size() -> None:
    y = np.random.default_rng(2).standard_normal(60)
    client = D.dirichlet_partition(y, 20, 0.01, 3, min_size=3)
    _check_partition(client, 60, 20, min_size=3)
    # a 2-D input whose rows are all identical still partitions
    _check_partition(D.dirichlet_partition(np.ones((50, 3)), 5, 1.0, 0), 50, 5)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((np.zeros(100), 10, 0.0, 0), "alpha"),
        ((np.zeros(100), 10, float("nan"), 0), "alpha"),
        ((np.zeros(100), 0, 1.0, 0), "n_clients"),
        ((np.zeros(10), 10, 1.0, 0), "cannot give"),
        ((np.zeros((2, 2, 2)), 2, 1.0, 0), "1-D or 2-D"),
        ((np.array([0.0, np.inf, 1.0, 2.0]), 2, 1.0, 0), "non-finite"),
    ],
)
def test_dirichlet_partition_rejects_bad_input(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        D.dirichlet_partition(*args)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(20, 300),
    K=st.integers(1, 10),
    alpha=st.floats(0.01, 100.0),
    n_labels=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_dirichlet_partition_property(n: int, K: int, alpha: float, n_labels: int,
                                      seed: int) -> None:
    y = np.random.default_rng(seed).integers(0, n_labels, size=n)
    _check_partition(D.dirichlet_partition(y, K, alpha, seed), n, K)


def test_even_partition() -> None:
    for K in (1, 2, 5, 10, 20, 50, 100):
        client = D.even_partition(1372, K, 0)
        sizes = np.bincount(client, minlength=K)
        assert client.shape == (1372,) and sizes.sum() == 1372
        assert sizes.max() - sizes.min() <= 1
    assert np.array_equal(D.even_partition(100, 7, 5), D.even_partition(100, 7, 5))
    with pytest.raises(ValueError, match="exceeds"):
        D.even_partition(5, 6, 0)
    with pytest.raises(ValueError, match="n_clients"):
        D.even_partition(5, 0, 0)


# ------------------------------------------------------------------------------------------
# Synthetic settings
# ------------------------------------------------------------------------------------------


def test_aux_target_formula() -> None:
    # d = 5, 1-based j: j=1 sin(4 pi x1), j=2 x2*x3, j=3 step(x3), j=4 sin(4 pi x4),
    # j=5 x5*x1 (the partner index (j mod d) + 1 wraps around)
    x = np.array([[0.125, 0.2, 0.7, 0.375, 0.3]])
    expected = 1.0 + 0.2 * 0.7 + 1.0 - 1.0 + 0.3 * 0.125
    assert D._aux_target(x)[0] == pytest.approx(expected)


def test_tree_distilled_f() -> None:
    f = D.tree_distilled_f(20, 0)
    assert f is D.tree_distilled_f(20, 0)  # cached
    assert f.tree.get_depth() == 8
    X = np.random.default_rng(0).uniform(-10, 10, size=(500, 20))
    out = f(X)
    assert out.shape == (500,) and out.dtype == np.float64
    g = pickle.loads(pickle.dumps(f))
    assert np.array_equal(g(X), out)
    assert not np.array_equal(D.tree_distilled_f(20, 1)(X), out)
    # f distils y_aux: it explains much of its variance on a fresh uniform sample
    y_aux = D._aux_target((X + 10) / 20)
    assert 1 - np.mean((out - y_aux) ** 2) / y_aux.var() > 0.3
    with pytest.raises(ValueError, match="shape"):
        f(np.zeros((3, 5)))


def test_federated_regression_shapes_and_determinism() -> None:
    train, test = D.make_federated_regression("homogeneous", seed=7)
    assert train.X.shape == (1400, 20) and test.X.shape == (600, 20)
    assert train.task == "regression" and train.client is not None
    assert np.bincount(train.client).tolist() == [140] * 10
    assert np.bincount(test.client).tolist() == [60] * 10
    again = D.make_federated_regression("homogeneous", seed=7)
    assert np.array_equal(again.train.X, train.X) and np.array_equal(again.test.y, test.y)
    other = D.make_federated_regression("homogeneous", seed=8)
    assert not np.array_equal(other.train.X, train.X)
    with pytest.raises(ValueError, match="covariate_shift"):
        D.make_federated_regression("label_shift")
    with pytest.raises(ValueError, match="test_size"):
        D.make_federated_regression(test_size=1.0)


@pytest.mark.parametrize("setting", ["homogeneous", "covariate_shift", "outcome_shift", "full"])
def test_federated_regression_statistics(setting: str) -> None:
    p = D.SYNTHETIC_SETTINGS[setting]
    train, test = D.make_federated_regression(setting, n_clients=4, n_per_client=3000, seed=0)
    f = D.tree_distilled_f(20, 0)
    X = np.vstack([train.X, test.X])
    y = np.concatenate([train.y, test.y])
    client = np.concatenate([train.client, test.client])
    resid_all = y - f(X)
    for k in range(4):
        sign = -1.0 if k % 2 == 0 else 1.0  # (-1)^k for the paper's k = client + 1
        Xk, rk = X[client == k], resid_all[client == k]
        assert Xk.mean() == pytest.approx(sign * p["gamma"], abs=0.03)
        assert Xk.var(axis=0).mean() == pytest.approx(p["alpha"], rel=0.05)
        assert rk.mean() == pytest.approx(sign * p["delta"], abs=0.05)
        assert rk.var() == pytest.approx(0.5, rel=0.1)  # noise variance 0.5


def test_federated_regression_overrides() -> None:
    f = D.tree_distilled_f(3, 0)
    train, _ = D.make_federated_regression(
        "homogeneous", n_clients=2, n_per_client=2000, d=3, gamma=1.0, delta=2.0,
        noise_var=0.0, f=f, seed=0,
    )
    assert train.client is not None
    assert train.X[train.client == 1].mean() == pytest.approx(1.0, abs=0.05)
    resid = train.y - f(train.X)
    assert np.allclose(resid[train.client == 0], -2.0)


def test_disjoint_supports() -> None:
    train, test = D.make_disjoint_supports(2.5, n_per_client=2000, seed=0)
    assert train.X.shape == (2800, 5) and test.X.shape == (1200, 5)
    assert train.client is not None
    for k, sign in ((0, -1.0), (1, 1.0)):
        Xk = train.X[train.client == k]
        assert Xk[:, 0].mean() == pytest.approx(sign * 2.5, abs=0.08)
        assert np.abs(Xk[:, 1:].mean(0)).max() < 0.08
        assert Xk.std(0).mean() == pytest.approx(1.0, rel=0.05)
    resid = train.y - 10.0 * (train.X[:, 0] > 0)
    assert resid.std() == pytest.approx(1.0, rel=0.05)
    a = D.make_disjoint_supports(1.0, seed=3)
    b = D.make_disjoint_supports(1.0, seed=3)
    assert a.train.X.shape == (210, 5)
    assert np.array_equal(a.train.y, b.train.y)


def test_overlapping_supports() -> None:
    train, _ = D.make_overlapping_supports(1.0, n_per_client=3000, seed=0)
    assert train.client is not None
    for k, sign in ((0, -1.0), (1, 1.0)):
        Xk = train.X[train.client == k]
        assert np.allclose(Xk.mean(0), sign * 1.0, atol=0.08)
        assert Xk.std(0).mean() == pytest.approx(1.5, rel=0.05)
    assert (train.y - train.X[:, 0]).std() == pytest.approx(1.0, rel=0.05)
    with pytest.raises(ValueError, match="gamma"):
        D.make_overlapping_supports(-1.0)


@pytest.mark.parametrize("fraction", [0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 1.0])
def test_contaminate_outliers_exact_fraction(fraction: float) -> None:
    train, _ = D.make_federated_regression("homogeneous", seed=0)
    X = train.X
    X_before = X.copy()
    out, rows = D.contaminate_outliers(X, fraction, 0)
    assert np.array_equal(X, X_before)  # input untouched
    assert rows.size == round(fraction * X.shape[0])
    assert len(np.unique(rows)) == rows.size
    changed = np.flatnonzero(np.any(out != X, axis=1))
    assert np.array_equal(changed, rows)
    assert np.allclose(out[rows], 1000.0 * X[rows])
    out2, rows2 = D.contaminate_outliers(X, fraction, 0)
    assert np.array_equal(out2, out) and np.array_equal(rows2, rows)


def test_contaminate_outliers_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="fraction"):
        D.contaminate_outliers(np.ones((4, 2)), 1.5, 0)
    with pytest.raises(ValueError, match="2-D"):
        D.contaminate_outliers(np.ones(4), 0.5, 0)
