"""``top_l`` shortlists features for ``method="avgimp"`` only: the estimators warn and train
on every drawn feature with another method; a job file that sets it with another method is
refused."""

from __future__ import annotations

import numpy as np
import pytest

from fedforest_secure import FedForestRegressor, load_profile
from server_app.jobspec import JobSpec, build_config
from server_app.settings import ConfigError

DATA = {"task": "regression", "n_features": 4, "feature_bounds": [(0.0, 1.0)] * 4}


def _spec(**kw: object) -> JobSpec:
    base: dict[str, object] = {"id": "j", "clients": ["a", "b", "c", "d"],
                               "profile": "open", "data": DATA}
    base.update(kw)
    return JobSpec.model_validate(base)


def test_estimator_warns_that_top_l_is_ignored_with_another_method() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4))
    y = X[:, 0] + rng.normal(size=300)
    h = rng.integers(0, 3, 300)
    kw = dict(n_estimators=2, max_depth=3, method="quantiles", random_state=0)
    with pytest.warns(UserWarning) as rec:
        a = FedForestRegressor(top_l=1, **kw).fit(X, y, client=h)
    assert [str(w.message) for w in rec] == [
        "top_l=1 is ignored with method='quantiles': top_l applies to method='avgimp' only; "
        "every drawn feature is evaluated"]
    assert a.config_.top_l is None
    b = FedForestRegressor(**kw).fit(X, y, client=h)
    assert a.model_.digest() == b.model_.digest()


def test_estimator_keeps_top_l_with_avgimp() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4))
    y = X[:, 0] + rng.normal(size=300)
    est = FedForestRegressor(n_estimators=2, max_depth=3, method="avgimp", top_l=1,
                             random_state=0).fit(X, y, client=rng.integers(0, 3, 300))
    assert est.config_.top_l == 1


def test_job_file_with_top_l_and_another_method_is_refused() -> None:
    with pytest.raises(ConfigError) as exc:
        build_config(_spec(forest={"method": "quantiles", "top_l": 2}))
    assert str(exc.value) == (
        "job 'j': [forest] top_l = 2 applies to method = \"avgimp\" only, and the job's "
        "method is 'quantiles': remove top_l, or set method = \"avgimp\"")
    # under DP an unset method is the allocation rule's ("random"): refused too, and with
    # secure aggregation avgimp's top_l is no fix (it discloses each site's top-L features)
    with pytest.raises(ConfigError) as exc:
        build_config(_spec(profile="secure-dp", profile_overrides={"epsilon": 2.0},
                           forest={"top_l": 2}))
    assert str(exc.value) == (
        "job 'j': [forest] top_l = 2 applies to method = \"avgimp\" only, and the job's "
        "method is 'random': remove top_l (with method = \"avgimp\" it discloses each site's "
        "top-L features in the clear, which a profile with secure aggregation never does)")
    assert build_config(_spec(forest={"method": "avgimp", "top_l": 2})).top_l == 2


def test_avgimp_takes_a_cut_leaving_exactly_min_samples_leaf_rows() -> None:
    """The best cut of x leaves exactly 5 rows on its left: with min_samples_leaf = 5 AvgImp
    takes it, as the quantile method does."""
    x = np.arange(20, dtype=float)
    y = np.where(x < 5, 10.0, 0.0)
    h = np.tile([0, 1], 10)
    thr = {}
    for method in ("quantiles", "avgimp"):
        est = FedForestRegressor(n_estimators=1, max_depth=1, bootstrap=False,
                                 max_features=None, min_samples_leaf=5, n_bins=32,
                                 method=method, random_state=0).fit(x[:, None], y, client=h)
        thr[method] = float(est.model_.trees[0].threshold[0])
    assert 4 < thr["avgimp"] < 5 and thr["avgimp"] == thr["quantiles"]


def test_top_l_shortlists_nothing_from_a_client_that_abstained_at_the_node() -> None:
    """x0 has the largest summed local gain but is neither sending client's top-1 (each has a
    stronger feature of its own); client 2 has 3 rows and abstains (abstain_below = 5): its
    ranking is empty and must not shortlist x0."""
    rng = np.random.default_rng(0)
    n = 200

    def client(strong: int) -> tuple[np.ndarray, np.ndarray]:
        X = rng.uniform(-1, 1, size=(n, 3))
        return X, (1.0 * (X[:, 0] > 0) + 1.15 * (X[:, strong] > 0)
                   + rng.normal(scale=0.05, size=n))

    (X0, y0), (X1, y1) = client(1), client(2)
    X = np.vstack([X0, X1, rng.uniform(-1, 1, size=(3, 3))])
    y = np.r_[y0, y1, np.zeros(3)]
    h = np.repeat([0, 1, 2], [n, n, 3])
    est = FedForestRegressor(n_estimators=1, max_depth=1, bootstrap=False, max_features=None,
                             method="avgimp", top_l=1, n_bins=16, random_state=0,
                             profile=load_profile("open", abstain_below=5)).fit(X, y, client=h)
    assert int(est.model_.trees[0].feature[0]) in (1, 2)
