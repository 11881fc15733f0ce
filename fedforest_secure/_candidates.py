"""Candidate thresholds: the split-finding methods, behind a registry.

A method decides what the level's sketch round asks of the clients (:meth:`CandidateMethod.
sketch_request`), turns the answers into candidate thresholds per (node, feature slot)
(:meth:`CandidateMethod.candidates`), and what the histogram round returns for them
(:attr:`CandidateMethod.stats`). :data:`CANDIDATE_METHODS` maps the names a job's ``method``
takes to the classes, like scikit-learn's ``CRITERIA`` and ``SPLITTERS``:

* ``quantiles``: the pooled quantile sketch (Theorem 1 of the paper); with the profile's
  ``sketch = "secure_cdf"`` the pooled CDF comes from securely summed counts on a grid refined
  in extra rounds, otherwise from the clients' disclosed quantile sketches;
* ``avgimp``: the same candidates, scored by the clients' summed local gains (AvgImp), with
  an optional Top-L shortlist of features;
* ``exact``: every midpoint between distinct values (discloses them: open profile only);
* ``histogram``: fixed-width bins on each feature's range (Kalloori et al.);
* ``random``: no candidates are evaluated: every node splits on one of its sampled features
  (uniformly) at a threshold drawn in its public box from the feature's pooled marginal counts
  (one counting round at the first level, :mod:`~fedforest_secure._random_splits`); besides
  those counts only the leaves' totals are released.

Under differential privacy the candidates are fixed-width bins of each node's box whatever the
method (:func:`box_grid`): they depend on public bounds and earlier splits only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from . import _impurity, _kernels, _random_splits, _secure_cdf, _sketch
from ._layouts import categorical_cuts, counts_block, moments_block
from .errors import InvalidMessage, ProfileError, ProtocolError
from .protocol import Task, TaskKind

if TYPE_CHECKING:  # config imports this module for METHODS: no import of config at run time
    from ._planner import AskRound, Disclosures, LevelContext, Received
    from ._release import ReleasePolicy
    from .config import JobConfig

__all__ = ["CANDIDATE_METHODS", "AvgImp", "CandidateMethod", "CandidateQuery", "Exact",
           "Histogram", "Quantiles", "RandomSplits", "SketchRequest", "box_grid",
           "fixed_width_grid", "make_method"]


@dataclass(frozen=True)
class SketchRequest:
    """What a level's sketch round asks per node: task parameters and disclosures."""

    params: dict[str, Any] = field(default_factory=dict)
    disclose: tuple[str, ...] = ()


@dataclass
class CandidateQuery:
    """The evaluated nodes of a level and what their sketch round returned."""

    ctx: LevelContext
    nodes: np.ndarray  # (E,) level indices of the evaluated nodes
    pos: np.ndarray  # (E,) their rows in the disclosures
    feats: np.ndarray  # (E, m) their sampled features
    disc: Disclosures


class CandidateMethod(ABC):
    """One way of finding candidate thresholds (module docstring)."""

    #: the name a job's ``method`` uses
    name: ClassVar[str]
    #: what the histogram round returns: "full" per-bin statistics, or "gain" (AvgImp)
    stats: ClassVar[str] = "full"

    def __init__(self, config: JobConfig, policy: ReleasePolicy) -> None:
        self.config = config
        self.policy = policy
        #: threads for the coordinator's own work (None: this thread); never changes a result
        self.executor: Executor | None = None

    def sketch_request(self) -> SketchRequest:
        """What the level's sketch round asks of every client for this method."""
        return SketchRequest()

    def needs_range(self) -> bool:
        """Whether the clients' feature ranges must be disclosed (no public bounds)."""
        return False

    def node_bytes(self, m: int) -> float:
        """Estimated memory per evaluated node of the state its rounds create besides the
        clients' sorted orders: here the histogram round's replies (:meth:`reply_bytes`)."""
        return self.reply_bytes(m)

    def reply_bytes(self, m: int) -> float:
        """Memory per evaluated node of its histogram round: a client's reply and the running
        sum (``8 * 2`` bytes per value: the in-process federation adds the replies one by one,
        in the clear or in the ring, as each client answers). A reply holds per feature slot
        the statistics of each of its ``max(B, L)`` bins (one more with missing values; ``L``
        the most levels of a categorical feature; ``S`` values each: the class counts, or
        ``(n, sum y)``), or with AvgImp two values per candidate."""
        cfg = self.config
        bt = max(cfg.n_bins - 1, max(cfg.levels, default=0) - 1)  # categorical_cuts' width
        miss = int(cfg.has_missing)
        if self.stats == "gain":  # gain_block
            values = 2 * (2 * bt + 1 if miss else bt)
        else:  # hist_block / moments_block
            values = (bt + 1 + miss) * (2 if cfg.task == "regression" else cfg.n_stats)
        return 16.0 * m * values

    def plans_whole_level(self) -> bool:
        """Whether the candidates of a level are planned over all its nodes at once (then
        the level is never evaluated in groups)."""
        return False

    def sorts_level(self) -> bool:
        """Whether the level's sketch round has every client sort its level (the sketches
        read the sorted order, and so does the histogram round); otherwise a client answers
        the level's histogram rounds by one pass over its pairs."""
        return True

    def fuses_histogram(self) -> bool:
        """Whether the candidate rounds also return the statistics of the bins between the
        candidates (:meth:`grid_evaluation`), so the level needs no histogram round."""
        return False

    def grid_evaluation(self, q: CandidateQuery, ask: AskRound
                        ) -> Generator[Task, Received, tuple[np.ndarray, np.ndarray]]:
        """Candidates (E, m, Bt), categorical levels included, and the summed statistics of
        their bins (E, m, Bt + 1, S'); only where :meth:`fuses_histogram`."""
        raise ProtocolError(f"internal: method {self.name!r} has a histogram round")
        yield  # pragma: no cover - makes this a generator

    @abstractmethod
    def candidates(self, q: CandidateQuery, ask: AskRound
                   ) -> Generator[Task, Received, np.ndarray]:
        """Candidate thresholds (E, m, Bt), sorted and +inf padded per (node, slot); may run
        rounds of its own through ``ask``."""

    def shortlist(self, q: CandidateQuery) -> np.ndarray:
        """The features evaluated per node (E, m), -1 where a slot is left out."""
        return q.feats


class Quantiles(CandidateMethod):
    """Candidates at the quantiles of the pooled sketch (per-client sketches or secure CDF)."""

    name = "quantiles"

    def __init__(self, config: JobConfig, policy: ReleasePolicy) -> None:
        super().__init__(config, policy)
        # the secure sketch's prior (pooled marginals) and the widest cell found to hold a
        # single value, per feature: both learnt from earlier levels' sums
        self._marginal = _secure_cdf.Marginal(config.n_features)
        self._atom_width = np.zeros(config.n_features)

    @property
    def _client_sketches(self) -> bool:
        return self.policy.sketch == "quantiles"

    def sketch_request(self) -> SketchRequest:
        if self._client_sketches:
            return SketchRequest({"n_points": self.config.n_bins}, ("sketch_points",))
        return SketchRequest()

    def node_bytes(self, m: int) -> float:
        cfg = self.config
        sketches = 8.0 * cfg.n_clients * m * (cfg.n_bins + 1) if self._client_sketches else 0.0
        return sketches + self.reply_bytes(m)

    def plans_whole_level(self) -> bool:
        return self.policy.sketch == "secure_cdf"

    def sorts_level(self) -> bool:
        # the secure sketch's grids are answered by one pass over the pairs; under DP the
        # candidates are fixed bins of the box (box_grid) and the clients sort as before
        return self._client_sketches or self.policy.dp

    def fuses_histogram(self) -> bool:
        # with missing values the level keeps its histogram round (the grids have no cell
        # for the rows missing a feature)
        return (not self._client_sketches and not self.policy.dp and self.stats == "full"
                and not self.config.has_missing)

    def candidates(self, q: CandidateQuery, ask: AskRound
                   ) -> Generator[Task, Received, np.ndarray]:
        if self._client_sketches:
            return pooled_sketch_candidates(q.disc, q.pos, q.feats, self.config.n_bins,
                                            self.executor)
        thr, _ = yield from self._grid_rounds(q, ask, with_stats=False)
        return thr

    def grid_evaluation(self, q: CandidateQuery, ask: AskRound
                        ) -> Generator[Task, Received, tuple[np.ndarray, np.ndarray]]:
        thr, hist = yield from self._grid_rounds(q, ask, with_stats=True)
        if hist is None:  # pragma: no cover - asked with statistics
            raise ProtocolError("internal: the grid rounds carried no statistics")
        return thr, hist

    def _grid_rounds(self, q: CandidateQuery, ask: AskRound, with_stats: bool
                    ) -> Generator[Task, Received, tuple[np.ndarray, np.ndarray | None]]:
        """The secure pooled-CDF sketch (:mod:`~fedforest_secure._secure_cdf`).

        Every round sums, per cell of a grid inside each node's box (public bounds intersected
        with the ancestors' splits), the rows' counts and, ``with_stats``, the statistics a
        split's gain needs (:func:`~fedforest_secure._layouts.moments_block`); cells holding
        more than ``3/B_nu`` of their node are refined in further rounds. Categorical slots
        ride along in the first round with one bin per level. Returns the candidates
        (categorical cuts included) and, ``with_stats``, their bins' statistics.
        """
        ctx, cfg = q.ctx, self.config
        if ctx.box_lo is None or ctx.box_hi is None:  # pragma: no cover - policy checks
            raise ProfileError("the secure_cdf sketch needs public feature bounds")
        nodes, feats = q.nodes, q.feats
        E, m = feats.shape
        lo = ctx.box_lo[nodes[:, None], feats]
        hi = ctx.box_hi[nodes[:, None], feats]
        planner = _secure_cdf.SecureCdfPlanner(
            lo, hi, feats, ctx.is_cat, ctx.n[nodes], cfg.n_bins, self.policy.rows_per_point,
            marginal=self._marginal, atom_width=self._atom_width,
            keep_cells=self._learns(lo, hi, feats))
        cat_slot = (feats >= 0) & ctx.is_cat[np.maximum(feats, 0)]
        cat_cells: tuple[np.ndarray, np.ndarray] | None = None
        # the first round asks every node with a grid or a categorical slot; a refinement
        # round only the (node, slot) rows refined (:meth:`SecureCdfPlanner.next_round`)
        grid = planner.next_grid()
        if grid is None and cat_slot.any():
            grid = np.full((E, m, 1), np.inf)
        question: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        if grid is not None:
            active = planner.active_features()
            if cat_slot.any():  # one bin per level, in the first round only
                grid = categorical_cuts(grid, feats, ctx.is_cat, cfg.levels)
                active = np.where(cat_slot, feats, active)
            rows = np.flatnonzero((active >= 0).any(axis=1))
            question = (rows, active, grid) if rows.size == E else \
                (rows, active[rows], grid[rows])
            del grid, active
        while question is not None:
            rows, active, grid = question
            nb = grid.shape[2] + 1
            block = (moments_block(cfg, rows.size, m, nb) if with_stats
                     else counts_block(rows.size, m, nb))
            task = ask(TaskKind.HISTOGRAM, ctx.level,
                       {"stats": "moments" if with_stats else "count", "purpose": "sketch"},
                       {"nodes": nodes if rows.size == E else nodes[rows],
                        "features": active, "thresholds": grid}, (block,))
            del question, active, grid
            blocks, _ = yield task
            got = blocks[block.name]
            del blocks, task
            if cat_cells is None and cat_slot.any():  # the first round: the levels' bins
                sel = cat_slot[rows]
                cat_cells = ((rows[:, None] * m + np.arange(m))[sel], got[sel])
            counts = _impurity.counts_of(got, cfg.task) if with_stats else got[..., 0]
            planner.receive(counts, got if with_stats else None, rows)
            del got, counts
            question = planner.next_round()
        self._learn(planner)
        thr = categorical_cuts(planner.candidates(), feats, ctx.is_cat, cfg.levels)
        if not with_stats:
            return thr, None
        num = planner.histogram() if planner.carries_stats else None
        S = cfg.n_stats if cfg.task != "regression" else 2
        del planner
        if num is not None and num.shape[2:] == (thr.shape[2] + 1, S):
            hist = num  # the planner's own array: it is done
        else:
            hist = np.zeros((E, m, thr.shape[2] + 1, S))
            if num is not None:
                hist[:, :, : num.shape[2]] = num
        if cat_cells is not None:
            at, cells = cat_cells
            w = min(cells.shape[1], hist.shape[2])
            hist.reshape((E * m,) + hist.shape[2:])[at, :w] = cells[:, :w]
        return thr, hist

    def _learns(self, lo: np.ndarray, hi: np.ndarray, feats: np.ndarray) -> np.ndarray:
        """(E, m) the (node, slot) rows the prior learns from (:meth:`_learn`): a feature it
        does not know yet, on a node whose box is still the public range."""
        bounds = self.config.feature_bounds
        if bounds is None:  # pragma: no cover - the policy checks
            return np.zeros(feats.shape, dtype=bool)
        pub = np.array(bounds, dtype=np.float64)
        fr = np.maximum(feats, 0)
        full_box: np.ndarray = ((lo <= pub[fr, 0]) & (hi >= pub[fr, 1])
                                & ~self._marginal.known[fr])
        return full_box

    def _learn(self, planner: _secure_cdf.SecureCdfPlanner) -> None:
        """Update the prior (marginals of features first seen on a node whose box is still
        the public range: the rows of :meth:`_learns`) and the atoms' widths from a level's
        final grids."""
        rows, edges, counts = planner.final_cells()
        f = planner.feats.reshape(-1)[rows]
        self._marginal.learn(f, planner.lo[rows], planner.hi[rows], edges, counts,
                             np.ones(rows.size, dtype=bool))
        fa, wa = planner.atoms()
        if fa.size:
            np.maximum.at(self._atom_width, fa, wa)


class AvgImp(Quantiles):
    """Quantile candidates scored by the clients' summed local gains (AvgImp), with an
    optional Top-L shortlist: only features some client ranks among its best L."""

    name = "avgimp"
    stats = "gain"

    def sketch_request(self) -> SketchRequest:
        req = super().sketch_request()
        top_l = self.config.top_l
        if top_l is None:
            return req
        params = dict(req.params, top_l=top_l)
        params.setdefault("n_points", self.config.n_bins)
        return SketchRequest(params, (*req.disclose, "top_l"))

    def shortlist(self, q: CandidateQuery) -> np.ndarray:
        feats, nodes, disc, pos = q.feats, q.nodes, q.disc, q.pos
        if self.config.top_l is None or not nodes.size:
            return feats
        keep = np.zeros_like(feats, dtype=bool)
        for k in disc:
            top = disc[k]["top_l"][pos]
            sent = (disc[k]["sketch_counts"][pos] > 0).any(axis=1) \
                if "sketch_counts" in disc[k] else np.ones(nodes.size, dtype=bool)
            rows = np.repeat(np.arange(nodes.size), top.shape[1])
            keep[rows[np.repeat(sent, top.shape[1])], top[sent].ravel()] = True
        return np.where(keep, feats, -1)


class Exact(CandidateMethod):
    """Every midpoint between consecutive distinct values the clients disclose."""

    name = "exact"

    def sketch_request(self) -> SketchRequest:
        return SketchRequest({}, ("unique",))

    def node_bytes(self, m: int) -> float:
        # the candidates are the distinct values the sketch round discloses: how many, and so
        # the histogram's width, is known only after that round; the sorted orders' share
        # (``8 m n_nu``) bounds the groups
        return 0.0

    def candidates(self, q: CandidateQuery, ask: AskRound
                   ) -> Generator[Task, Received, np.ndarray]:
        yield from ()
        return exact_candidates(q.disc, q.pos, q.feats.shape[1])


class Histogram(CandidateMethod):
    """Fixed-width bins on each feature's global range (Kalloori et al.): the public bounds,
    or else the clients' disclosed minima and maxima."""

    name = "histogram"

    def needs_range(self) -> bool:
        return self.config.feature_bounds is None

    def candidates(self, q: CandidateQuery, ask: AskRound
                   ) -> Generator[Task, Received, np.ndarray]:
        yield from ()
        if q.ctx.lohi is None:  # pragma: no cover - the range was disclosed at level 0
            raise ProtocolError("internal: no histogram range")
        return fixed_width_grid(q.ctx.lohi[q.feats], self.config.n_bins)


class RandomSplits(CandidateMethod):
    """Random splits: one of each node's sampled features, uniformly, at a threshold drawn in
    the node's public box from the features' pooled marginal distribution (one counting round
    at the first level). Nothing is evaluated; :meth:`draw` replaces the candidates."""

    name = "random"

    def node_bytes(self, m: int) -> float:
        return 0.0  # no histogram round: nothing is evaluated

    def candidates(self, q: CandidateQuery, ask: AskRound
                   ) -> Generator[Task, Received, np.ndarray]:
        yield from ()
        raise ProtocolError("internal: random splits are drawn, not evaluated")

    @staticmethod
    def draw(rng: np.random.Generator, feats: np.ndarray, box_lo: np.ndarray,
             box_hi: np.ndarray, cdf: np.ndarray | None = None,
             bounds: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Feature and threshold per node (:func:`~._random_splits.random_splits`)."""
        return _random_splits.random_splits(rng, feats, box_lo, box_hi, cdf, bounds)


#: the candidate methods by the name a job's ``method`` takes
CANDIDATE_METHODS: dict[str, type[CandidateMethod]] = {
    cls.name: cls for cls in (Quantiles, AvgImp, Exact, Histogram, RandomSplits)}


def make_method(config: JobConfig, policy: ReleasePolicy) -> CandidateMethod:
    """The candidate method the job's configuration names.

    Raises
    ------
    ValueError
        A name :data:`CANDIDATE_METHODS` does not hold.
    """
    try:
        cls = CANDIDATE_METHODS[config.method]
    except KeyError:
        raise ValueError(f"unknown candidate method {config.method!r}; one of "
                         f"{sorted(CANDIDATE_METHODS)}") from None
    return cls(config, policy)


# ---------------------------------------------------------------------- thresholds
def pooled_sketch_candidates(disc: Disclosures, ev: np.ndarray, feats: np.ndarray,
                             B: int, executor: Executor | None = None) -> np.ndarray:
    """Candidates from the clients' disclosed quantile sketches (rows ``ev``), pooled; runs of
    nodes on ``executor``'s threads when given (the same candidates either way)."""
    E, m = feats.shape
    clients = sorted(disc)
    if E == 0 or not clients:
        return np.full((E, m, B - 1), np.inf)
    K = len(clients)
    # each client's rows that have the slot's feature, the paper's n_{node,k}: (E, m, K)
    cnt = np.stack([disc[k]["sketch_counts"][ev] for k in clients], axis=2)
    P = disc[clients[0]]["sketch_points"].shape[2]
    lengths = {}
    for k in clients:  # a list is NaN-padded at its end only
        try:
            lengths[k] = _sketch.list_lengths(disc[k]["sketch_points"])
        except ValueError:
            raise InvalidMessage(f"client {k}'s quantile sketch has a point after its "
                                 "padding") from None
    thr = np.empty((E, m, B - 1))
    # the clients' sketches are gathered a run of nodes at a time: never a K-fold copy
    step = max(1, _sketch.CHUNK_ENTRIES // max(K * P * m, 1))

    def run(a: int) -> None:  # a row's candidates do not depend on the other rows
        sel = ev[a:a + step]
        at: slice | np.ndarray = sel
        if sel.size and sel[-1] - sel[0] == sel.size - 1 and (np.diff(sel) == 1).all():
            at = slice(int(sel[0]), int(sel[-1]) + 1)  # a run of nodes: views, one copy
        counts = cnt[a:a + step].reshape(sel.size * m, K)
        npts = np.stack([lengths[k][at] for k in clients], axis=2).reshape(sel.size * m, K)
        if isinstance(at, slice) and _kernels.KERNELS is not None and P > 0:
            # the compiled loops read each client's rows in place (views)
            lists = [disc[k]["sketch_points"][at].reshape(sel.size * m, P) for k in clients]
            cand = _sketch.pooled_candidates_lists(lists, counts, B, npts)
        else:
            pts = np.stack([disc[k]["sketch_points"][at] for k in clients], axis=2)
            cand = _sketch.pooled_candidates(pts.reshape(sel.size * m, K, P), counts, B, npts)
        thr[a:a + step] = cand.reshape(sel.size, m, B - 1)

    starts = range(0, E, step)
    if executor is None or len(starts) < 2:
        for a in starts:
            run(a)
    else:
        for _ in executor.map(run, starts):  # each run writes its own rows of thr
            pass
    return thr


def exact_candidates(disc: Disclosures, ev: np.ndarray, m: int) -> np.ndarray:
    """Midpoints of the union of the clients' distinct values per (node ``ev``, slot)."""
    E = ev.size
    per_block: list[np.ndarray] = []
    for i in ev:
        for s in range(m):
            b = i * m + s
            parts = [disc[k]["unique_vals"][disc[k]["unique_ptr"][b]:
                                            disc[k]["unique_ptr"][b + 1]] for k in disc]
            u = np.unique(np.concatenate(parts)) if parts else np.zeros(0)
            mid = (u[:-1] + u[1:]) / 2.0
            mid = np.where(mid == u[1:], u[:-1], mid)  # scikit-learn's rounding guard
            per_block.append(mid)
    width = max([p.size for p in per_block], default=0)
    out = np.full((E * m, max(width, 1)), np.inf)
    for r, p in enumerate(per_block):
        out[r, : p.size] = p
    return out.reshape(E, m, max(width, 1))


def fixed_width_grid(lohi: np.ndarray, n_bins: int) -> np.ndarray:
    """``n_bins - 1`` cuts of fixed width on ``[lo, hi]`` per range ``lohi[..., :]``
    (shape (..., 2)); +inf where the range is empty."""
    frac = np.arange(1, n_bins) / n_bins
    lo, hi = lohi[..., 0], lohi[..., 1]
    thr = lo[..., None] + (hi - lo)[..., None] * frac
    return np.where((hi > lo)[..., None], thr, np.inf)


def box_grid(ctx: LevelContext, nodes: np.ndarray, feats: np.ndarray, n_bins: int
             ) -> np.ndarray:
    """Fixed-width cuts of each evaluated node's box per slot (the candidates under DP)."""
    if ctx.box_lo is None or ctx.box_hi is None:  # pragma: no cover - the policy checks
        raise ProfileError("differential privacy needs public feature bounds")
    return fixed_width_grid(np.stack([ctx.box_lo[nodes[:, None], feats],
                                      ctx.box_hi[nodes[:, None], feats]], axis=-1), n_bins)
