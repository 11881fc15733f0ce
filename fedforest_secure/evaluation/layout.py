"""The additive statistics an evaluation sums over sites, block by block.

Every metric of :mod:`.metrics` is a function of sums over held-out rows, so each site sends its
own sums and only their total is needed. Per model:

classification (``C`` classes; ROC classes ``R = 1`` for two classes, the positive class, else
``R = C``, one-vs-rest; ``G`` score bins, ``Bc`` calibration bins)

=================  ==============  =====  ====================================================
block              shape           kind   a row adds
=================  ==============  =====  ====================================================
``confusion``      (C, C)          count  1 at (true class, predicted class)
``scores``         (R, G, 2)       count  1 per ROC class r at (r, bin of p_r, y == r)
``calib_counts``   (R, Bc, 2)      count  per r: 1 at (r, bin of p_r, 0), and at (..., 1) if y == r
``calib_prob``     (R, Bc)         real   p_r at (r, bin of p_r); bound 1
``log_loss``       (1,)            real   -log(clip(p_y, floor, 1 - floor)); bound -log(floor)
``brier``          (1,)            real   sum_c (1[y == c] - p_c)^2; bound 2
=================  ==============  =====  ====================================================

regression (target range [lo, hi], ``mid`` its centre, ``h = (hi - lo) / 2``; ``P`` bins of the
prediction over [lo, hi])

=================  ==============  =====  ====================================================
``count``          (1,)            count  1
``err``            (1,)            real   yhat - y; bound 2h, signed
``sq_err``         (1,)            real   (yhat - y)^2; bound 4h^2
``abs_err``        (1,)            real   abs(yhat - y); bound 2h
``y``              (1,)            real   y - mid; bound h, signed
``y_sq``           (1,)            real   (y - mid)^2; bound h^2
``pva_counts``     (P,)            count  1 at the bin of yhat
``pva_y``          (P,)            real   y - mid at the bin of yhat; bound h, signed
``pva_pred``       (P,)            real   yhat - mid at the bin of yhat; bound h, signed
=================  ==============  =====  ====================================================

(``y`` is centred on the range's middle so that ``sum (y - mean)^2 = sum y_c^2 - (sum y_c)^2 / n``
cancels little.) Each row's contribution is clipped to its bound (a table that satisfies the
schema is never clipped, except predictions under DP).

``count``, ``y`` and ``y_sq`` depend on the rows only, not on the model (``data_only``).

``l1`` / ``l2`` of a block: how far one record moves the block (one model), in units of its
bound: the DP sensitivities of :mod:`.noise`, checked by brute-force removal in the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..protocol import Block, StatKind
from .spec import EvalSpec, EvaluationError

__all__ = ["EXACT_LIMBS", "EvalLayout", "StatBlock", "eval_layout"]

#: Ring entries per real-valued statistic without DP (:mod:`.encoding`).
EXACT_LIMBS = 3


@dataclass(frozen=True)
class StatBlock:
    """One block of a model's statistics.

    Attributes
    ----------
    name : str
    shape : tuple of int
        Per model.
    real : bool
        A sum of real values (else a count of rows).
    bound : float
        Largest absolute contribution of one row to one entry (1 for counts).
    signed : bool
        Entries may be negative.
    l1, l2 : float
        Norms of the change one record makes to the block, in units of ``bound``.
    touched : int
        Entries one record changes.
    data_only : bool
        A sum of the rows alone (the same for every model scored on them).
    """

    name: str
    shape: tuple[int, ...]
    real: bool
    bound: float = 1.0
    signed: bool = False
    l1: float = 1.0
    l2: float = 1.0
    touched: int = 1
    data_only: bool = False

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class EvalLayout:
    """The statistics of one evaluation: ``n_models`` copies of ``blocks``."""

    task: str
    n_classes: int
    n_models: int
    blocks: tuple[StatBlock, ...]
    #: regression: the target range the statistics are centred and binned on
    target_range: tuple[float, float] = (0.0, 1.0)
    score_bins: int = 0
    calibration_bins: int = 0
    pva_bins: int = 0
    log_loss_floor: float = 0.0

    @property
    def roc_classes(self) -> list[int]:
        """The classes whose one-vs-rest scores are binned (the positive class of two)."""
        return [1] if self.n_classes == 2 else list(range(self.n_classes))

    def block(self, name: str) -> StatBlock:
        for b in self.blocks:
            if b.name == name:
                return b
        raise KeyError(name)

    def width(self, block: StatBlock, dp: bool) -> int:
        """Ring entries per statistic: limbs for exact real sums, one otherwise."""
        return EXACT_LIMBS if block.real and not dp else 1

    def wire(self, dp: bool) -> tuple[Block, ...]:
        """The task layout: one protocol block per statistics block, every model, all counts
        in the ring (:mod:`.encoding` turns real sums into integers)."""
        out = []
        for b in self.blocks:
            w = self.width(b, dp)
            out.append(Block(b.name, (self.n_models, *b.shape, w), (StatKind.COUNT,) * w))
        return tuple(out)

    @property
    def stat_size(self) -> int:
        """Statistics per model."""
        return sum(b.size for b in self.blocks)


def eval_layout(spec: EvalSpec, task: str, n_classes: int, target_bound: float,
                dp: bool, *, target_offset: float = 0.0) -> EvalLayout:
    """The statistics layout of an evaluation of ``spec`` (see the module docstring); a
    regression target without the spec's own range lies in ``target_offset +- target_bound``."""
    floor = spec.floor(dp)
    m = len(spec.models)
    if task == "classification":
        if n_classes < 2:
            raise EvaluationError("classification needs at least two classes")
        C = n_classes
        R = 1 if C == 2 else C
        G, Bc = spec.bins(dp), spec.calibration_bins
        blocks: tuple[StatBlock, ...] = (
            StatBlock("confusion", (C, C), real=False),
            StatBlock("scores", (R, G, 2), real=False, l1=R, l2=math.sqrt(R), touched=R),
            # per ROC class one count, plus the positive count of the true class
            StatBlock("calib_counts", (R, Bc, 2), real=False, l1=R + 1, l2=math.sqrt(R + 1),
                      touched=R + 1),
            # the probabilities of a row add up to 1: sum p_r <= 1 and sum p_r^2 <= 1
            StatBlock("calib_prob", (R, Bc), real=True, l1=1.0, l2=1.0, touched=R),
            StatBlock("log_loss", (1,), real=True, bound=-math.log(floor)),
            StatBlock("brier", (1,), real=True, bound=2.0),
        )
        return EvalLayout(task, C, m, blocks, score_bins=G, calibration_bins=Bc,
                          log_loss_floor=floor)
    if task != "regression":
        raise EvaluationError(f"unknown task {task!r}")
    if spec.target_range is not None:
        lo, hi = spec.target_range
    else:
        if not (math.isfinite(target_bound) and target_bound > 0):
            raise EvaluationError("a regression evaluation needs the target's public bounds")
        lo, hi = target_offset - float(target_bound), target_offset + float(target_bound)
    h = (hi - lo) / 2.0
    P = spec.pva_bins
    blocks = (
        StatBlock("count", (1,), real=False, data_only=True),
        StatBlock("err", (1,), real=True, bound=2 * h, signed=True),
        StatBlock("sq_err", (1,), real=True, bound=4 * h * h),
        StatBlock("abs_err", (1,), real=True, bound=2 * h),
        StatBlock("y", (1,), real=True, bound=h, signed=True, data_only=True),
        StatBlock("y_sq", (1,), real=True, bound=h * h, data_only=True),
        StatBlock("pva_counts", (P,), real=False),
        StatBlock("pva_y", (P,), real=True, bound=h, signed=True),
        StatBlock("pva_pred", (P,), real=True, bound=h, signed=True),
    )
    return EvalLayout(task, 0, m, blocks, target_range=(lo, hi), pva_bins=P,
                      log_loss_floor=floor)
