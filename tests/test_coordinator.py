"""Tests for fedforest_secure.coordinator: round structure, submit() checks, H splits,
categorical splits and profile checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedforest_secure import FedForestRegressor
from fedforest_secure._tree import NodeKind
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.errors import InvalidMessage, ProfileError, ProtocolError
from fedforest_secure.federation import PlainSum, RoundRecord, client_seed, run_in_process
from fedforest_secure.privacy import load_profile
from fedforest_secure.protocol import TaskKind, layout_size
from fedforest_secure.worker import Worker

OPEN = load_profile("open").to_dict()


def _cfg(**kw: Any) -> JobConfig:
    base: dict[str, Any] = dict(job_id="job", task="regression", n_features=3, n_clients=3,
                                n_estimators=2, max_depth=3, min_samples_leaf=3, max_features=2,
                                n_bins=8, profile=OPEN, random_state=1)
    base.update(kw)
    return JobConfig(**base)


def _clients(n: int = 400, K: int = 3, d: int = 3,
             seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(K):
        X = rng.normal(loc=0.2 * k, size=(n // K, d))
        y = X[:, 0] * 2 + np.sin(3 * X[:, 1]) + 0.1 * rng.normal(size=n // K)
        out.append((X, y))
    return out


@pytest.mark.parametrize("method", ["quantiles", "histogram", "avgimp"])
def test_rounds_are_two_per_level_plus_one_whatever_the_number_of_trees(method: str) -> None:
    depth = 3
    counts = []
    for T in (1, 6):
        cfg = _cfg(n_estimators=T, max_depth=depth, method=method,
                   feature_bounds=((-5.0, 5.0),) * 3)
        recs: list[RoundRecord] = []
        model = run_in_process(cfg, _clients(), on_round=recs.append)
        kinds = [r.task.kind.value for r in recs]
        assert all(t.depth == depth for t in model.trees)  # every level had work to do
        assert len(kinds) == 2 * depth + 1
        assert kinds == ["sketch", "histogram"] * depth + ["sketch"]
        assert model.meta["rounds"] == len(kinds)
        counts.append(len(kinds))
    assert counts[0] == counts[1]


def _drive(cfg: JobConfig, clients: list[tuple[np.ndarray, np.ndarray]],
           tamper: Any = None) -> Coordinator:
    workers = [Worker(cfg, X, y, client_index=k, seed=client_seed(cfg, k))
               for k, (X, y) in enumerate(clients)]
    coord = Coordinator(cfg)
    agg = PlainSum()
    while (task := coord.next_task()) is not None:
        replies = {k: w.handle(task) for k, w in enumerate(workers)}
        total = agg.aggregate(task, replies)
        disc = {k: r.disclosed for k, r in replies.items() if r.disclosed}
        if tamper is not None:
            tamper(coord, task, total, disc)
        coord.submit(task.round_id, total, disc)
    return coord


def test_submit_rejects_bad_aggregates_and_changes_nothing() -> None:
    cfg = _cfg()
    clients = _clients()
    reference = _drive(cfg, clients).result()
    seen: list[int] = []

    def tamper(coord: Coordinator, task: Any, total: np.ndarray, disc: dict) -> None:
        seen.append(task.round_id)
        with pytest.raises(ProtocolError):
            coord.submit(task.round_id + 1, total, disc)
        with pytest.raises(ProtocolError):
            coord.submit(task.round_id - 1, total, disc)
        with pytest.raises(InvalidMessage):
            coord.submit(task.round_id, total[:-1], disc)
        with pytest.raises(InvalidMessage):
            coord.submit(task.round_id, np.concatenate([total, [0.0]]), disc)
        bad = total.copy()
        bad[0] = np.nan
        with pytest.raises(InvalidMessage):
            coord.submit(task.round_id, bad, disc)
        bad[0] = np.inf
        with pytest.raises(InvalidMessage):
            coord.submit(task.round_id, bad, disc)
        with pytest.raises(ProtocolError):  # something the round did not ask for
            coord.submit(task.round_id, total, {0: {"raw_rows": np.zeros(3)}})
        if task.kind == TaskKind.HISTOGRAM:
            with pytest.raises(ProtocolError):  # sketches only travel in sketch rounds
                coord.submit(task.round_id, total, {0: {"sketch_points": np.zeros(3)}})
        assert coord.next_task() is task  # still the same open round

    tampered = _drive(cfg, clients, tamper).result()
    assert len(seen) == 2 * cfg.max_depth + 1
    assert tampered.to_json() == reference.to_json()
    coord = _drive(cfg, clients)
    assert coord.done and coord.next_task() is None
    with pytest.raises(ProtocolError):
        coord.submit(99, np.zeros(1))


def test_result_before_training_finishes() -> None:
    coord = Coordinator(_cfg())
    assert not coord.done
    with pytest.raises(ProtocolError):
        coord.result()
    task = coord.next_task()
    assert task is not None and task.round_id == 1 and task.level == 0
    assert layout_size(task.layout) == 2 * 3  # T nodes x (n, sum y, sum y^2)


def _shifted_clients(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = 300
    h = np.repeat(np.arange(3), n // 3)
    X = rng.normal(size=(n, 2))
    y = 0.3 * X[:, 0] + 10.0 * h + 0.1 * rng.normal(size=n)  # outcome shift by client only
    return X, y, h


def test_h_splits_on_client_shift() -> None:
    X, y, h = _shifted_clients()
    est = FedForestRegressor(n_estimators=3, max_depth=3, min_samples_leaf=5,
                             max_features=None, split_on_client=True, n_bins=8,
                             random_state=0).fit(X, y, client=h)
    trees = est.model_.trees
    assert all(t.kind[0] == NodeKind.CLIENT for t in trees)  # the client shift dominates the root
    assert est.model_.uses_client
    pred = est.predict(X, client=h)
    for k in range(3):
        assert abs(pred[h == k].mean() - y[h == k].mean()) < 0.5
    with pytest.raises(ValueError, match="client"):
        est.predict(X)
    # the same rows attributed to another client get that client's level
    assert np.all(est.predict(X[:5], client=np.full(5, 2)) > 15)
    # without H splits the root cannot isolate the shift
    plain = FedForestRegressor(n_estimators=3, max_depth=3, min_samples_leaf=5,
                               max_features=None, n_bins=8, random_state=0).fit(X, y, client=h)
    assert not plain.model_.uses_client
    assert plain.predict(X).shape == (300,)


def test_h_splits_refused_by_profiles_without_them_with_the_remedy() -> None:
    """The refusal says what would allow the splits: h_splits 'clear' (disclosing) or, under
    DP, 'noisy' with dp.h_epsilon, or split_on_client=False."""
    for profile in (load_profile("open", h_splits="off"), load_profile("secure")):
        with pytest.raises(ProfileError, match=r"h_splits='off'.*h_splits='clear'.*"
                                               r"h_splits='noisy'.*split_on_client=False"):
            Coordinator(_cfg(split_on_client=True, profile=profile.to_dict()))


def test_h_split_rounds_disclose_node_stats_only_when_enabled() -> None:
    X, y, h = _shifted_clients()
    clients = [(X[h == k], y[h == k]) for k in range(3)]
    recs: list[RoundRecord] = []
    run_in_process(_cfg(n_features=2, max_features=2, split_on_client=True), clients,
                   on_round=recs.append)
    assert all("node_stats" in r.task.disclose for r in recs
               if r.task.kind == TaskKind.SKETCH and r.task.level < 3)
    recs.clear()
    run_in_process(_cfg(n_features=2, max_features=2), clients, on_round=recs.append)
    assert not any("node_stats" in r.task.disclose for r in recs)


def test_categorical_split_by_level_sets() -> None:
    rng = np.random.default_rng(2)
    n = 360
    lv = rng.integers(0, 6, n)
    x1 = rng.normal(size=n)
    y = np.where(np.isin(lv, [1, 3, 4]), 5.0, 0.0) + 0.1 * x1 + 0.05 * rng.normal(size=n)
    X = np.column_stack([lv.astype(float), x1])
    h = np.arange(n) % 3
    cfg = _cfg(n_features=2, max_features=2, n_estimators=1, max_depth=1, bootstrap=False,
               feature_kinds=("categorical", "continuous"), n_levels=(6, 0))
    model = run_in_process(cfg, [(X[h == k], y[h == k]) for k in range(3)])
    tree = model.trees[0]
    assert tree.kind[0] == NodeKind.CATEGORICAL and tree.feature[0] == 0
    assert set(tree.sets[0]) in ({1, 3, 4}, {0, 2, 5})
    pred = model.predict(X)
    left = np.isin(lv, tree.sets[0])
    np.testing.assert_allclose(pred[left], y[left].mean(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(pred[~left], y[~left].mean(), rtol=0, atol=1e-12)
    # deeper: the forest follows the level structure
    cfg2 = _cfg(n_features=2, max_features=2, n_estimators=3, max_depth=4,
                feature_kinds=("categorical", "continuous"), n_levels=(6, 0))
    m2 = run_in_process(cfg2, [(X[h == k], y[h == k]) for k in range(3)])
    p2 = m2.predict(X)
    assert np.abs(p2 - y).mean() < 0.2
    # an unseen level code at prediction goes right, never crashes
    assert np.isfinite(m2.predict(np.array([[7.0, 0.0]]))).all()


def test_profile_checks() -> None:
    secure = load_profile("secure").to_dict()
    with pytest.raises(ProfileError):  # exact discloses every value
        Coordinator(_cfg(method="exact", profile=secure))
    with pytest.raises(ProfileError):  # the secure sketch needs public bounds
        Coordinator(_cfg(profile=secure))
    Coordinator(_cfg(profile=secure, feature_bounds=((0.0, 1.0),) * 3))


def test_deterministic_given_config() -> None:
    cfg = _cfg()
    a = run_in_process(cfg, _clients())
    b = run_in_process(cfg, _clients())
    assert a.to_json() == b.to_json()
    c = run_in_process(_cfg(random_state=2), _clients())
    assert c.to_json() != a.to_json()


def test_avgimp_level_without_splittable_nodes() -> None:
    """AvgImp grows a forest when no node of a level can be split (an empty gain block)."""
    from fedforest_secure import FedForestRegressor

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = (X[:, 0] > 0).astype(float)
    model = FedForestRegressor(method="avgimp", top_l=3, n_estimators=2).fit(
        X, y, client=np.repeat([0, 1], 20))
    assert model.model_.trees[0].n_nodes > 1  # it did split before running out of nodes
    assert ((model.predict(X) > 0.5) == (y > 0.5)).mean() > 0.7


def test_dp_spends_and_split_decisions_are_reported_for_the_audit_log() -> None:
    """Under secure-dp every release spends an equal share through the accountant, the
    running total never exceeds the budget, and every split decision is reported once."""
    from fedforest_secure.config import JobConfig
    from fedforest_secure.coordinator import Coordinator
    from fedforest_secure.federation import client_seed
    from fedforest_secure.privacy import load_profile
    from fedforest_secure.secure_sum import RingAggregator
    from fedforest_secure.worker import Worker

    rng = np.random.default_rng(4)
    X = rng.normal(size=(240, 4))
    y = (X[:, 0] > 0).astype(int)
    prof = load_profile("secure-dp", epsilon=2.0).to_dict()
    cfg = JobConfig(job_id="dp-audit", task="classification", n_features=4, n_clients=3,
                    n_classes=2, n_estimators=3, max_depth=3, max_features=2, n_bins=4,
                    bootstrap=False, row_sampling="all", criterion="gini", profile=prof,
                    feature_bounds=((-5.0, 5.0),) * 4, target_bound=1.0)
    parts = np.arange(240) % 3
    workers = [Worker(cfg, X[parts == k], y[parts == k], client_index=k,
                      seed=client_seed(cfg, k)) for k in range(3)]
    coord, agg = Coordinator(cfg), RingAggregator(cfg)
    spends, decisions = [], []
    while (task := coord.next_task()) is not None:
        replies = {k: w.handle(task) for k, w in enumerate(workers)}
        coord.submit(task.round_id, agg.aggregate(task, replies), participants=[0, 1, 2])
        sp, dec = coord.pop_events()
        spends += sp
        decisions += dec
    assert len(spends) == cfg.max_depth
    assert all(s["total_epsilon"] <= 2.0 + 1e-9 for s in spends)
    assert spends[-1]["total_epsilon"] == pytest.approx(2.0, rel=1e-6)
    n_splits = sum(int((t.kind != 0).sum()) for t in coord.result().trees)
    assert sum(len(d["splits"]) for d in decisions) == n_splits
    assert coord.pop_events() == ([], [])


@pytest.mark.parametrize("missing", [False, True])
def test_regression_histogram_rounds_ask_counts_and_sums_of_y_only(missing: bool) -> None:
    """A split's gain needs (n, sum y) per bin (the sums of y^2 cancel): the open profile's
    histogram round asks those two statistics, the clients answer them, and the forest is
    the one a job with missing values allowed (an empty missing bin) grows."""
    cfg = _cfg(missing_allowed=(True,) * 3) if missing else _cfg()
    recs: list[RoundRecord] = []
    model = run_in_process(cfg, _clients(), on_round=recs.append)
    hist = [r for r in recs if r.task.kind == TaskKind.HISTOGRAM]
    assert hist and all(r.task.params["stats"] == "moments" for r in hist)
    assert all(r.task.layout[0].shape[-1] == 2 for r in hist)
    if missing:
        assert [t.to_dict() for t in model.trees] == \
            [t.to_dict() for t in run_in_process(_cfg(), _clients()).trees]


def _drive_with_a_drop(cfg: JobConfig, clients: list[tuple[np.ndarray, np.ndarray]],
                       drop_after: int) -> Coordinator:
    """The rounds of ``cfg`` over ``clients``, the last of them dropped after round
    ``drop_after`` (its rows are in that round's sum, never in a later one)."""
    workers = [Worker(cfg, X, y, client_index=k, seed=client_seed(cfg, k))
               for k, (X, y) in enumerate(clients)]
    coord = Coordinator(cfg)
    while (task := coord.next_task()) is not None:
        alive = range(len(workers) if task.round_id <= drop_after else len(workers) - 1)
        replies = {k: workers[k].handle(task) for k in alive}
        disc = {k: r.disclosed for k, r in replies.items() if r.disclosed}
        coord.submit(task.round_id, PlainSum().aggregate(task, replies), disc,
                     participants=list(alive))
    return coord


@pytest.mark.parametrize("task", ["regression", "classification"])
@pytest.mark.parametrize("drop_after", [1, 2, 3])
def test_after_a_site_drops_every_split_nodes_count_is_its_childrens(
        task: str, drop_after: int) -> None:
    """A site that drops mid-job is in the node totals of the levels before its drop and in
    none after. Every split node's weighted count, value and impurity are those of its
    children's rows together, so the feature importances subtract like quantities: without
    that, the root held 456 rows and its children 297."""
    clients = _clients(n=600)
    if task == "classification":
        clients = [(X, (y > 0.5).astype(np.int64)) for X, y in clients]
    cfg = _cfg(task=task, n_classes=2 if task == "classification" else 0,
               criterion="gini" if task == "classification" else "mse", max_depth=4,
               bootstrap=False, row_sampling="all")
    model = _drive_with_a_drop(cfg, clients, drop_after).result()
    split_nodes = 0
    for tree in model.trees:
        inner = np.flatnonzero(tree.kind != NodeKind.LEAF)
        split_nodes += inner.size
        left, right = tree.left[inner], tree.right[inner]
        assert np.allclose(tree.n[inner], tree.n[left] + tree.n[right], rtol=1e-12)
        kids = tree.n[left, None] * tree.value[left] + tree.n[right, None] * tree.value[right]
        assert np.allclose(tree.n[inner, None] * tree.value[inner], kids, rtol=1e-9)
        # an impurity decrease is never below zero when parent and children agree
        assert tree.impurity is not None
        dec = tree.n[inner] * tree.impurity[inner] - tree.n[left] * tree.impurity[left] \
            - tree.n[right] * tree.impurity[right]
        assert (dec >= -1e-9 * tree.n[inner]).all()
    assert split_nodes > 0
    if drop_after == 1:  # dropped after the roots' totals: no node holds its rows
        assert all(tree.n[0] == sum(len(y) for _, y in clients[:-1]) for tree in model.trees)


def test_a_subtree_whose_rows_all_left_with_the_dropped_site_keeps_the_counts_consistent(
        ) -> None:
    """The third site's y is far off, so the root splits on the site indicator and the third
    site's node is split below it; the site drops after. That node's subtree has no rows in
    the later rounds: the node is empty (its value kept), and every count is still its
    children's together."""
    rng = np.random.default_rng(0)
    clients = []
    for k in range(3):
        X = rng.normal(size=(200, 3))
        clients.append((X, 0.01 * X[:, 0] + 0.1 * rng.normal(size=200)
                        + (50.0 if k == 2 else 0.0)))
    cfg = _cfg(max_depth=4, bootstrap=False, row_sampling="all", n_estimators=1,
               max_features=3, split_on_client=True)
    coord = _drive_with_a_drop(cfg, clients, drop_after=4)
    tree = coord.result().trees[0]
    assert tree.kind[0] == NodeKind.CLIENT
    inner = np.flatnonzero(tree.kind != NodeKind.LEAF)
    assert np.allclose(tree.n[inner], tree.n[tree.left[inner]] + tree.n[tree.right[inner]])
    gone = next(i for i in inner if tree.n[i] == 0)  # the third site's node
    assert coord.unreconciled is not None
    assert np.array_equal(tree.value[gone], coord.unreconciled.trees[0].value[gone])


@pytest.mark.parametrize("drop_after", [1, 2, 3])
def test_random_splits_keep_their_inner_nodes_from_the_leaves_after_a_drop(
        drop_after: int) -> None:
    """Random splits set every inner node from its leaves' totals already (with their own
    rules under DP), so their counts are their children's after a drop too, untouched by the
    reconciliation."""
    cfg = _cfg(method="random", bootstrap=False, row_sampling="all",
               feature_bounds=((-5.0, 5.0),) * 3)
    coord = _drive_with_a_drop(cfg, _clients(n=600), drop_after=drop_after)
    assert coord.unreconciled is None
    for tree in coord.result().trees:
        inner = np.flatnonzero(tree.kind != NodeKind.LEAF)
        assert inner.size
        assert np.allclose(tree.n[inner], tree.n[tree.left[inner]] + tree.n[tree.right[inner]])


def test_the_replay_of_an_older_servers_log_of_a_job_that_lost_a_site_verifies() -> None:
    """A server before the split nodes of a job that lost a site took their children's totals
    logged the forest without that step: the replay accepts that digest as well as today's,
    and no other."""
    import hashlib
    from types import SimpleNamespace

    from fedforest_secure.audit.replay import _check_model

    coord = _drive_with_a_drop(_cfg(bootstrap=False, row_sampling="all"), _clients(n=600), 2)
    assert coord.unreconciled is not None

    def said(model: Any) -> list[str]:
        digest = hashlib.sha256(model.for_job(None, ["a", "b", "c"]).to_json().encode())
        entry = SimpleNamespace(label="model entry", payload={"digest": digest.hexdigest()})
        return _check_model(coord, entry, None, ["a", "b", "c"])  # type: ignore[arg-type]

    assert said(coord.result()) == [] and said(coord.unreconciled) == []
    other = _drive(_cfg(bootstrap=False, row_sampling="all"), _clients(n=600)).result()
    assert said(other) and "the log says" in said(other)[0]


def _flood(disclosed: dict[str, np.ndarray], values: int) -> dict[str, np.ndarray]:
    """``disclosed`` with its first (node, slot) block of distinct values replaced by
    ``values`` made-up ones (well formed: finite, the pointers rising)."""
    ptr, vals = disclosed["unique_ptr"].copy(), disclosed["unique_vals"]
    first = int(ptr[1] - ptr[0])
    ptr[1:] += values - first
    return {**disclosed, "unique_ptr": ptr,
            "unique_vals": np.concatenate([np.linspace(-1e6, 1e6, values), vals[first:]])}


@pytest.mark.parametrize("grouped", [False, True])
def test_a_site_listing_more_distinct_values_than_a_nodes_rows_is_refused(grouped: bool) -> None:
    """Open profile, method="exact": every distinct value a site lists becomes a candidate
    that every site's next histogram carries. A site that lists more values at a node than
    the node's pooled rows (from the round's node totals, or for a node group the level's) is
    refused, naming the block; nothing is taken and the honest answers go on."""
    cfg = _cfg(method="exact", n_estimators=2, max_depth=3)
    clients = _clients()
    workers = [Worker(cfg, X, y, client_index=k, seed=client_seed(cfg, k))
               for k, (X, y) in enumerate(clients)]
    coord = Coordinator(cfg, max_nodes_per_round=1 if grouped else None)
    agg = PlainSum()
    while True:  # to the first round that asks distinct values
        task = coord.next_task()
        assert task is not None
        replies = {k: w.handle(task) for k, w in enumerate(workers)}
        if "unique" in task.disclose:
            break
        coord.submit(task.round_id, agg.aggregate(task, replies),
                     {k: dict(r.disclosed) for k, r in replies.items() if r.disclosed})
    assert ("nodes" in task.arrays) is grouped
    total = agg.aggregate(task, replies)
    disc = {k: dict(r.disclosed) for k, r in replies.items()}
    rows = 399  # the root's pooled rows: 2 trees, each a bootstrap of the 3 x 133 rows
    assert np.diff(disc[2]["unique_ptr"])[0] <= 133
    with pytest.raises(InvalidMessage) as err:
        coord.submit(task.round_id, total, {**disc, 2: _flood(disc[2], rows + 1)})
    assert str(err.value) == (
        "client 2: disclosed item 'unique_vals' lists 400 distinct values at the node of the "
        f"task's features row 0 (slot 0), more than its {rows} rows there: a site has no "
        "more distinct values at a node than rows")
    assert coord.next_task() is task  # nothing was taken
    coord.submit(task.round_id, total, {**disc, 2: _flood(disc[2], rows)})  # as many: taken
