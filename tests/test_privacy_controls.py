"""End-to-end checks of the privacy controls through the real protocol (docs/privacy.md).

Unit tests of the pieces live elsewhere (test_privacy_rules, test_worker, test_secure_cdf,
test_dp_noise, test_privacy_profile); here each control is checked where it takes effect:

* minimum-leaf abstention, in the open and in the secure profile: per node, how many clients
  contribute, what an abstaining client uploads (zeros) and what the server's sum holds;
* adaptive B: per-client sketch sizes (open, plaintext sketches) and the pooled B_nu of the
  secure CDF sketch;
* the DP noise of a real round's aggregate has the calibrated scale (seeded statistical test
  with a tiny false-positive rate, and a check that it catches a 20% mis-scaling);
* the profile travels with the model file; nonsense profiles and sketch sizes are refused.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fedforest_secure._secure_cdf as secure_cdf_mod
import fedforest_secure.privacy as privacy_pkg
from fedforest_secure import FedForestClassifier, FedForestRegressor, load_profile
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.errors import ProfileError
from fedforest_secure.federation import RoundRecord, client_seed, run_in_process
from fedforest_secure.privacy import (
    PrivacyProfile,
    Sensitivity,
    ZCdp,
    epsilon_of,
    histogram_sensitivity,
)
from fedforest_secure.protocol import Reply, StatKind, Task, TaskKind, kind_code, kinds_vector
from fedforest_secure.secure_sum import encode_contribution, entry_scale_bits, make_codec
from fedforest_secure.worker import Worker

K = 4


def _data(n: int = 240, d: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).round(3)
    h = rng.integers(0, K, n)
    X[:, 0] += 0.8 * h  # some covariate shift, so client node sizes differ
    y = X[:, 0] + np.sin(2 * X[:, 1]) + 0.2 * rng.normal(size=n)
    return X, y, h


def _config(profile: PrivacyProfile, X: np.ndarray, y: np.ndarray, **kw: Any) -> JobConfig:
    lo, hi = X.min(axis=0), X.max(axis=0)
    params: dict[str, Any] = dict(
        job_id="controls", task="regression", n_features=X.shape[1], n_clients=K,
        feature_bounds=tuple((float(a), float(b)) for a, b in zip(lo, hi, strict=True)),
        target_bound=float(np.abs(y).max()), n_estimators=3, max_depth=5, min_samples_leaf=2,
        max_features=X.shape[1], n_bins=16, random_state=5, profile=profile.to_dict())
    params.update(kw)
    return JobConfig(**params)


class _SpyWorker(Worker):
    """A worker that also records its per-node row counts *before* abstention: distinct rows
    (what the rule counts) and bootstrap-weighted rows (what the totals report)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pre: np.ndarray | None = None
        self.pre_w: dict[int, np.ndarray] = {}  # weighted counts, keyed by level
        self.log: list[tuple[Task, np.ndarray | None, Reply]] = []

    def _abstain(self, n_nodes: int) -> None:
        self.pre = np.bincount(self._p_node, minlength=n_nodes)
        self.pre_w[self._level] = np.bincount(self._p_node, weights=self._p_w,
                                                  minlength=n_nodes)
        super()._abstain(n_nodes)

    def handle(self, task: Task) -> Reply:
        rep = super().handle(task)
        pre = None if self.pre is None else self.pre.copy()
        self.log.append((task, pre, rep))
        return rep


def _run(profile: PrivacyProfile, X: np.ndarray, y: np.ndarray, h: np.ndarray,
         **kw: Any) -> tuple[list[_SpyWorker], list[RoundRecord], JobConfig]:
    cfg = _config(profile, X, y, **kw)
    workers = [_SpyWorker(cfg, X[h == k], y[h == k], client_index=k, seed=client_seed(cfg, k))
               for k in range(K)]
    records: list[RoundRecord] = []
    run_in_process(cfg, [(X[h == k], y[h == k]) for k in range(K)], workers=workers,
                   on_round=records.append)
    return workers, records, cfg


# ---------------------------------------------------------------------------- abstention
@pytest.mark.parametrize("name", ["open", "secure"])
def test_abstention_takes_effect_end_to_end(name: str) -> None:
    m = 12
    X, y, h = _data()
    prof = load_profile(name, abstain_below=m)
    workers, records, cfg = _run(prof, X, y, h)
    assert sum(v for w in workers for v in w.abstained.values()) > 0  # the rule did bite
    sketch_rounds = [r for r in records if r.task.kind == TaskKind.SKETCH]
    hist_rounds = [r for r in records if r.task.kind == TaskKind.HISTOGRAM
                   and r.task.params.get("stats") in ("full", "moments")]
    assert sketch_rounds and hist_rounds
    fewer_contributors = 0
    for rec in sketch_rounds:
        rid = rec.task.round_id
        n_nodes = int(rec.task.params["n_nodes"])
        per_client = []
        for w in workers:
            task, pre, rep = next(e for e in w.log if e[0].round_id == rid)
            assert pre is not None
            tot = rep.summable.reshape(n_nodes, cfg.n_stats)
            small = (pre > 0) & (pre < m)
            # an abstaining client uploads zeros for the node (all statistics), the others
            # upload their full (bootstrap-weighted) counts
            np.testing.assert_array_equal(tot[small], 0.0)
            np.testing.assert_allclose(tot[~small, 0], w.pre_w[task.level][~small])
            assert w.abstained[rec.task.level] == int(small.sum())
            per_client.append(tot[:, 0])
        counts = np.stack(per_client)  # (K, n_nodes)
        contributors = (counts > 0).sum(axis=0)
        # every contribution to a node is 0 or >= m rows
        assert ((counts == 0) | (counts >= m)).all()
        present = np.stack([next(e for e in w.log if e[0].round_id == rid)[1] for w in workers])
        fewer_contributors += int((contributors < (present > 0).sum(axis=0)).sum())
        # the server's sum is exactly the sum of the non-abstaining contributions
        server = rec.total.reshape(n_nodes, cfg.n_stats)[:, 0]
        np.testing.assert_allclose(server, counts.sum(axis=0), rtol=0, atol=1e-6)
    assert fewer_contributors > 0  # some node lost a contributor to abstention
    # abstained rows are also gone from the level's histograms
    for rec in hist_rounds:
        rid = rec.task.round_id
        nodes = rec.task.arrays["nodes"]
        shape = rec.task.layout[0].shape
        for w in workers:
            task, pre, rep = next(e for e in w.log if e[0].round_id == rid)
            assert pre is not None
            hist = rep.summable.reshape(shape)
            node_n = hist[:, 0, :, 0].sum(axis=1)  # slot 0, all bins, the count column
            small = (pre[nodes] > 0) & (pre[nodes] < m)
            asked = rec.task.arrays["features"][:, 0] >= 0  # a refinement round asks some
            np.testing.assert_array_equal(hist[small], 0.0)
            np.testing.assert_allclose(node_n[~small & asked],
                                       w.pre_w[task.level][nodes][~small & asked])


def test_without_abstention_small_nodes_are_reported() -> None:
    X, y, h = _data()
    workers, _, _ = _run(load_profile("open"), X, y, h)
    assert all(w.abstained == {} for w in workers)
    small = 0
    for w in workers:
        for task, pre, rep in w.log:
            if task.kind == TaskKind.SKETCH and pre is not None:
                tot = rep.summable.reshape(pre.size, -1)[:, 0]
                np.testing.assert_allclose(tot, w.pre_w[task.level])
                small += int(((pre > 0) & (pre < 12)).sum())
    assert small > 0  # the same data has nodes the rule above removes


# ---------------------------------------------------------------------------- adaptive B
def _open_sketches(r: int) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]], int]:
    """(points, n_k, d_k) of every per-client sketch disclosed in an open-profile run: n_k the
    sketch counts (bootstrap-weighted rows), d_k the client's distinct rows at the node."""
    X, y, h = _data()
    workers, _, cfg = _run(load_profile("open", rows_per_sketch_point=r), X, y, h)
    out = []
    for w in workers:
        for _task, pre, rep in w.log:
            if "sketch_points" not in rep.disclosed:
                continue
            pts, n_k = rep.disclosed["sketch_points"], rep.disclosed["sketch_counts"]
            assert pre is not None and pre.size == pts.shape[0]  # a whole level's sketch
            out.append((pts, n_k, np.repeat(pre[:, None], pts.shape[1], axis=1)))
    assert out
    return out, cfg.n_bins


@pytest.mark.parametrize("r", [1, 3])
def test_adaptive_b_open_limits_per_client_sketch_points(r: int) -> None:
    """B_k = min(B, floor(c_k / r)) + 1 points where c_k >= r, none below: with r >= 2 c_k is
    the client's distinct rows at the node (d_k: a row the bootstrap drew several times counts
    once), with r = 1 its weighted rows (n_k, the paper's rule)."""
    sketches, B = _open_sketches(r)
    checked = binding = repeated = 0
    for pts, n_k, d_k in sketches:  # pts: (n_nodes, m, B + 1) NaN-padded; n_k, d_k: (n_nodes, m)
        n_pts = np.isfinite(pts).sum(axis=2)
        assert (n_pts <= B + 1).all()
        c_k = d_k if r >= 2 else n_k.astype(int)
        enough = c_k >= r
        expect = np.minimum(B, c_k // r) + 1
        np.testing.assert_array_equal(n_pts[enough], expect[enough])
        np.testing.assert_array_equal(n_pts[~enough], 0)  # no point below r rows
        checked += int(enough.sum())
        binding += int((enough & (c_k // r < B)).sum())
        repeated += int((enough & (n_k // r > d_k // r) & (d_k // r < B)).sum())
    # the limit was below B somewhere, and rows the bootstrap repeated were somewhere
    assert checked > 0 and binding > 0 and repeated > 0


def test_adaptive_b_open_nodes_below_r_distinct_rows_disclose_no_point() -> None:
    """The documented rule (a sketch point summarises >= r distinct rows): a node where the
    client has fewer than r distinct rows gets no point, also where the bootstrap drew them
    r times or more (a lone record drawn twice would otherwise be its own min and max)."""
    sketches, _ = _open_sketches(3)
    drawn_often = 0
    for pts, n_k, d_k in sketches:
        n_pts = np.isfinite(pts).sum(axis=2)
        small = (d_k > 0) & (d_k < 3)
        np.testing.assert_array_equal(n_pts[small], 0)
        drawn_often += int((small & (n_k >= 3)).sum())
    assert drawn_often > 0


def test_adaptive_b_secure_follows_pooled_node_size(monkeypatch: pytest.MonkeyPatch) -> None:
    r = 2
    made: list[Any] = []
    base = secure_cdf_mod.SecureCdfPlanner

    class Recording(base):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)
            self.n_rows_in = np.asarray(args[4], dtype=np.float64)
            self.got: np.ndarray | None = None

        def candidates(self) -> np.ndarray:
            self.got = super().candidates()
            return self.got

    monkeypatch.setattr(secure_cdf_mod, "SecureCdfPlanner", Recording)
    X, y, h = _data()
    prof = load_profile("secure", rows_per_sketch_point=r, abstain_below=0)
    _, records, cfg = _run(prof, X, y, h)
    B = cfg.n_bins
    assert made
    # the pooled node sizes the planner got are the securely summed node totals
    sketch_totals = [rec.total.reshape(-1, cfg.n_stats)[:, 0] for rec in records
                     if rec.task.kind == TaskKind.SKETCH and rec.task.layout]
    binding = 0
    for planner in made:
        E, m = planner.shape
        n_rows = planner.n_rows_in
        expect = np.clip(n_rows // r, 1, B).astype(np.int64)
        np.testing.assert_array_equal(planner.bnu, np.repeat(expect, m))
        assert any(np.isin(n_rows, t).all() for t in sketch_totals)
        assert planner.got is not None
        n_cand = np.isfinite(planner.got).sum(axis=2).reshape(-1)
        assert (n_cand <= np.maximum(planner.bnu - 1, 0)).all()
        binding += int((expect < B).sum())
    assert binding > 0


# ---------------------------------------------------------------------------- DP noise scale
def _dp_round(task_kind: str = "regression") -> tuple[JobConfig, Task]:
    """A secure-dp job's first noisy round (level-0 histograms) from the real coordinator.

    16 trees x 3 feature slots x 32 bins: 1,536 entries of each statistic kind per vector, so
    25 decoded sums give 38,400 noise samples per kind (the sample size of the checks below).
    """
    X, y, _ = _data()
    prof = load_profile("secure-dp", epsilon=1.0)
    cfg = _config(prof, X, y, n_estimators=16, max_depth=3, n_bins=32, max_features=3,
                  row_sampling="disjoint", bootstrap=False, min_samples_leaf=5)
    coord = Coordinator(cfg)
    task = coord.next_task()
    assert task is not None and task.kind == TaskKind.SKETCH and not task.layout
    coord.submit(task.round_id, np.zeros(0))  # under DP the level-0 sketch releases nothing
    task = coord.next_task()
    assert task is not None and task.kind == TaskKind.HISTOGRAM and "dp" in task.params
    assert coord.dp_spends and coord.dp_spends[-1]["round"] == task.round_id
    assert task.layout[0].shape == (16, 3, 32, 3)
    return cfg, task


#: Decoded sums per check: 25 x 1,536 = 38,400 samples per statistic kind.
_REPS = 25


def _decoded_noise(cfg: JobConfig, task: Task, reps: int, seed: int,
                   monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    """``reps`` decoded sums of K clients' zero replies: pure aggregate noise, (reps, dims)."""
    rng = np.random.default_rng(seed)
    real = privacy_pkg.sample_discrete_gaussian
    monkeypatch.setattr(privacy_pkg, "sample_discrete_gaussian",
                        lambda sigma, size, rng_=None: real(sigma, size, rng))
    codec = make_codec(cfg, task)
    zero = Reply(round_id=task.round_id, summable=np.zeros(codec.ring.size))
    out = np.empty((reps, codec.ring.size))
    for i in range(reps):
        total = np.zeros(codec.ring.size, dtype=np.uint64)
        for _ in range(K):
            total += encode_contribution(cfg, task, zero)  # wraps mod 2**64 like the ring
        out[i] = codec.decode(total)
    monkeypatch.setattr(privacy_pkg, "sample_discrete_gaussian", real)
    return out


def _kind_mask(task: Task, kind: str) -> np.ndarray:
    """Entries of the task's flat vector holding statistics of ``kind``."""
    return np.asarray(kinds_vector(task.layout) == kind_code(StatKind(kind)))


def _scale_ok(samples: np.ndarray, expected_std: float, tol: float = 0.03) -> bool:
    """|empirical std / expected - 1| <= tol.

    Power of the check at the n = 38,400 samples per kind both DP tests use (the entries of
    one vector and of different rounds are i.i.d. draws, so only n matters): the std estimate
    has relative standard error 1/sqrt(2(n - 1)) = 0.36 %, so
    * false positive (a calibrated scale rejected): tol = 3 % is 8.3 standard errors,
      two-sided probability about 1e-16;
    * false negative (a 20 % mis-scaling accepted): std x 1/1.2 lands 0.137 below the
      tolerance band, 45 standard errors; std x 1.2 lands 0.17 above it, 39 standard
      errors: probability below 1e-300 either way.
    """
    return abs(float(samples.std()) / expected_std - 1.0) <= tol


def test_dp_noise_of_the_aggregate_matches_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, task = _dp_round()
    dp = task.params["dp"]
    slots = task.layout[0].shape[1]
    noise = _decoded_noise(cfg, task, reps=_REPS, seed=11, monkeypatch=monkeypatch)
    names = {"count": "count", "sum": "sum", "sumsq": "sum_sq"}
    k_min = 3  # ceil(K (1 - 0.33)) survivors
    rhos = []
    for kind, sigma_client in dp["sigma"].items():
        # the engine's calibration is the documented one: histogram sensitivity (disjoint rows:
        # one tree, multiplicity 1, one bin per feature slot), in ring units (sums: one more
        # unit per bin for each site's rounding), distributed over K_min survivors; every kind
        # of every level gets the same zCDP share
        sens = histogram_sensitivity(names[kind], n_features=slots, n_trees=1,
                                     max_multiplicity=1,
                                     target_bounds=(-cfg.target_bound, cfg.target_bound))
        sens = sens.scaled(entry_scale_bits(cfg, StatKind(kind)))
        if kind != "count":
            sens = Sensitivity(sens.l1 + slots, sens.l2 + math.sqrt(slots), sens.linf + 1)
        rhos.append(sens.l2**2 / (2 * k_min * sigma_client**2))
    assert rhos == pytest.approx([rhos[0]] * 3, rel=1e-9)
    # the max_depth levels' releases of the three kinds compose to the job's epsilon
    assert epsilon_of([ZCdp(r) for r in rhos] * cfg.max_depth, 1e-6) == pytest.approx(
        1.0, rel=1e-4)
    for kind, sigma_client in dp["sigma"].items():
        # the decoded sum of K noisy zero vectors has std sigma_client * sqrt(K) (stat units)
        samples = noise[:, _kind_mask(task, kind)].ravel()
        assert samples.size == 38_400
        expected = sigma_client * math.sqrt(K) / entry_scale_bits(cfg, StatKind(kind))
        assert _scale_ok(samples, expected), (kind, samples.std() / expected)
        assert abs(samples.mean()) < 6 * expected / math.sqrt(samples.size)
        # the test has power: a 20% error of the scale, either way, is caught
        assert not _scale_ok(samples, expected * 1.2)
        assert not _scale_ok(samples, expected / 1.2)


def test_dp_noise_check_catches_a_miscalibrated_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients that add 20% too little noise (a miscalibrated client) fail the check.

    Clients compute their noise scale from their own profile (``noise_sigmas``), never from
    the task, so the miscalibration is injected there. Same sample size and statistic as the
    calibration test (38,400 samples per kind, see ``_scale_ok`` for the error rates)."""
    from fedforest_secure import secure_sum

    cfg, task = _dp_round()
    good = dict(task.params["dp"]["sigma"])
    real = secure_sum.noise_sigmas

    def too_little(c: JobConfig, layout: Any, level: Any) -> tuple[dict[str, float], int]:
        sigmas, k_min = real(c, layout, level)
        return {k: v / 1.2 for k, v in sigmas.items()}, k_min

    monkeypatch.setattr(secure_sum, "noise_sigmas", too_little)
    noise = _decoded_noise(cfg, task, reps=_REPS, seed=12, monkeypatch=monkeypatch)
    for kind, sigma_client in good.items():
        expected = sigma_client * math.sqrt(K) / entry_scale_bits(cfg, StatKind(kind))
        samples = noise[:, _kind_mask(task, kind)].ravel()
        assert samples.size == 38_400
        assert not _scale_ok(samples, expected)


# ---------------------------------------------------------------------------- model file
@pytest.mark.parametrize("cls", [FedForestClassifier, FedForestRegressor])
def test_profile_is_stored_in_the_model_file(cls: Any, tmp_path: Path) -> None:
    X, y, h = _data(n=200)
    if cls is FedForestClassifier:
        y = (y > np.median(y)).astype(int)
    prof = load_profile("secure-dp", epsilon=2.5, delta=1e-7)
    est = cls(profile=prof, random_state=1).fit(X, y, client=h)
    path = tmp_path / "m.json"
    est.save(path)
    doc = json.loads(path.read_text())
    assert doc["estimator"]["params"]["profile"] == prof.to_dict()
    assert doc["estimator"]["config"]["profile"] == prof.to_dict()
    assert doc["estimator"]["params"]["profile"]["dp"]["epsilon"] == 2.5
    back = cls.load(path)
    assert back.profile_ == prof.to_dict()
    assert PrivacyProfile.from_dict(back.profile_) == prof
    assert back.config_.profile == prof.to_dict()
    # the DP defaults that were in effect are recorded too
    assert back.config_.n_estimators == est.config_.n_estimators
    assert back.config_.sampling == est.config_.sampling == "all"  # DP default: every row
    np.testing.assert_array_equal(back.predict(X), est.predict(X))


def test_open_profile_is_stored_too(tmp_path: Path) -> None:
    X, y, h = _data(n=120)
    est = FedForestRegressor(n_estimators=2, max_depth=2, random_state=0).fit(X, y, client=h)
    est.save(tmp_path / "o.json")
    back = FedForestRegressor.load(tmp_path / "o.json")
    assert back.profile_ == load_profile("open").to_dict()


# ---------------------------------------------------------------------------- nonsense
@pytest.mark.parametrize("overrides", [{"epsilon": 0.0}, {"epsilon": float("nan")},
                                       {"epsilon": -0.5}, {"delta": -1e-6},
                                       {"max_multiplicity": 0}])
def test_dp_profile_rejects_nonsense_budgets(overrides: dict[str, Any]) -> None:
    with pytest.raises(ProfileError):
        load_profile("secure-dp", **overrides)


def test_profile_file_with_unknown_dp_field_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    p.write_text(load_profile("secure-dp").to_toml().replace(
        "[dp]\n", "[dp]\nnoise_multiplier = 0.1\n"), encoding="utf-8")
    with pytest.raises(ProfileError, match="noise_multiplier: unknown field"):
        load_profile(p)


@pytest.mark.parametrize("profile", ["open", "secure"])
@pytest.mark.parametrize("n_bins", [1, 4097, 10**7])
def test_a_sketch_size_outside_2_to_4096_is_refused_as_a_job_file_refuses_it(
        profile: str, n_bins: int) -> None:
    X, y, h = _data(n=80)
    with pytest.raises(ValueError, match=r"The 'n_bins' parameter of FedForestRegressor must "
                       r"be an int in the range \[2, 4096\] or None"):
        FedForestRegressor(n_bins=n_bins, n_estimators=1, max_depth=1, profile=profile).fit(
            X, y, client=h)


def test_a_loaded_estimator_refits_with_its_stored_profile(tmp_path: Path) -> None:
    X, y, h = _data(n=120)
    prof = load_profile("secure-dp", epsilon=3.0)
    est = FedForestRegressor(n_estimators=2, max_depth=2, profile=prof).fit(X, y, client=h)
    est.save(tmp_path / "m.json")
    back = FedForestRegressor.load(tmp_path / "m.json")
    back.fit(X, y, client=h)
    assert back.profile_ == prof.to_dict()
