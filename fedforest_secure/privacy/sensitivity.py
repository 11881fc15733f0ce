"""Sensitivity of the per-bin statistics FedForest aggregates.

Neighbouring datasets differ by adding or removing one record (unbounded DP). Workers send every
per-bin statistic as a *histogram* (DESIGN invariant 3): at a given tree level a record sits in
exactly one node of each tree, and for each feature the node considers it falls in exactly one
bin. With bootstrap multiplicity ``m <= m_max`` (workers clip to ``m_max``) it adds ``m`` copies
of its contribution ``c`` to that one bin. Hence, for one round covering ``T`` trees and ``F``
features per node, the change of the whole statistic vector is bounded by::

    L1   = T * F * m_max * c
    L2   = sqrt(T * F) * m_max * c
    Linf = m_max * c

with ``c = 1`` for counts and class counts (one class bin per record), ``c = max(|lo|, |hi|)``
for sums of a regression target with public bounds ``[lo, hi]``, and ``c = max(lo**2, hi**2)``
for sums of squares. Node totals are the case ``F = 1``. Sent as cumulative left-child sums
instead, the record would move up to ``B`` entries per feature: ``L1`` and ``L2**2`` would grow
``B``-fold, which is why invariant 3 exists.

Statistics sent in one round combine with :meth:`Sensitivity.combine` (L1 add, L2 in quadrature).
A fixed-point encoding with ``frac_bits`` multiplies every bound by ``2**frac_bits``
(:meth:`Sensitivity.scaled`), which is the unit the integer noise is calibrated in. Each site
rounds its real sums (of ``y``, ``y**2``) to that integer grid before they are summed, so one
record moves each entry it touches by up to one more unit (:meth:`Sensitivity.rounded`); counts
are integers already.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import BudgetError

__all__ = ["Sensitivity", "StatKind", "abstention_factor", "histogram_sensitivity"]

StatKind = Literal["count", "class_count", "sum", "sum_sq"]


@dataclass(frozen=True)
class Sensitivity:
    """Bounds on how much one record can change a statistic vector.

    Attributes
    ----------
    l1, l2, linf : float
        Norm bounds of the change (``linf <= l2 <= l1``).
    """

    l1: float
    l2: float
    linf: float

    def __post_init__(self) -> None:
        vals = (self.l1, self.l2, self.linf)
        if not all(math.isfinite(v) and v >= 0 for v in vals):
            raise BudgetError(f"sensitivity must be finite and >= 0, got {vals}")

    def combine(self, other: Sensitivity) -> Sensitivity:
        """Sensitivity of two statistics released together (concatenated vectors)."""
        return Sensitivity(
            l1=self.l1 + other.l1,
            l2=math.hypot(self.l2, other.l2),
            linf=max(self.linf, other.linf),
        )

    def scaled(self, factor: float) -> Sensitivity:
        """Sensitivity after multiplying the statistic by ``factor`` (e.g. ``2**frac_bits``)."""
        if not (math.isfinite(factor) and factor > 0):
            raise BudgetError(f"scale factor must be finite and > 0, got {factor}")
        return Sensitivity(self.l1 * factor, self.l2 * factor, self.linf * factor)

    def rounded(self, cells: int) -> Sensitivity:
        """Sensitivity (in integer units) of a statistic that each site rounds to the integer
        grid: one record moves each of the ``cells`` entries it touches by up to one unit more
        than the exact value does (each rounding is off by at most half a unit), so
        ``L1 + cells``, ``L2 + sqrt(cells)`` (triangle inequality) and ``Linf + 1``."""
        if not isinstance(cells, int) or isinstance(cells, bool) or cells < 1:
            raise BudgetError(f"cells must be an int >= 1, got {cells!r}")
        return Sensitivity(self.l1 + cells, self.l2 + math.sqrt(cells), self.linf + 1.0)


def abstention_factor(profile: Mapping[str, Any]) -> int:
    """Rows one record can move into or out of a client's contribution to a node: 1, or
    ``abstain_below = m`` when minimum-leaf abstention is on (``m > 1``).

    Abstention is a threshold on a client's distinct rows at a node: the record that takes a
    client from ``m - 1`` rows to ``m`` brings all ``m`` rows into that node (and, under the
    node, into the one leaf per tree the record reaches; the client's other leaves stay below
    ``m``), and removing one of ``m`` rows takes them all out. Every sensitivity of a job with
    abstention is therefore ``m`` times that of one record (``tests/test_dp_abstention.py``).
    """
    m = int(profile.get("abstain_below", 0) or 0)
    return max(1, m)


def histogram_sensitivity(
    stat: StatKind,
    *,
    n_features: int = 1,
    n_trees: int = 1,
    max_multiplicity: int = 1,
    target_bounds: tuple[float, float] | None = None,
) -> Sensitivity:
    """Sensitivity of a per-bin histogram statistic for one aggregation round.

    Parameters
    ----------
    stat : {"count", "class_count", "sum", "sum_sq"}
        Record counts, per-class counts, sums of ``y`` or sums of ``y**2`` per bin.
    n_features : int
        Features ``F`` each record is binned on per node in this round (1 for node totals).
    n_trees : int
        Trees ``T`` whose statistics travel in the same vector.
    max_multiplicity : int
        Bootstrap multiplicity cap ``m_max`` (1 without bootstrap).
    target_bounds : (float, float), optional
        Public bounds of a regression target; required for ``"sum"`` and ``"sum_sq"``.

    Returns
    -------
    Sensitivity
        ``L1 = T F m_max c``, ``L2 = sqrt(T F) m_max c``, ``Linf = m_max c`` (module docstring).

    Raises
    ------
    BudgetError
        Missing or non-finite target bounds for a sum (bounds are never inferred from data),
        or non-positive counts.
    """
    for label, v in (
        ("n_features", n_features),
        ("n_trees", n_trees),
        ("max_multiplicity", max_multiplicity),
    ):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise BudgetError(f"{label} must be an int >= 1, got {v!r}")
    if stat in ("count", "class_count"):
        c = 1.0
    elif stat in ("sum", "sum_sq"):
        if target_bounds is None:
            raise BudgetError(
                f"sensitivity of {stat!r} needs public target bounds; refusing to infer them "
                "from data"
            )
        lo, hi = (float(b) for b in target_bounds)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise BudgetError(f"target bounds must be finite with lo <= hi, got {target_bounds}")
        c = max(abs(lo), abs(hi))
        if stat == "sum_sq":
            c = c * c
    else:
        raise BudgetError(f"unknown statistic {stat!r}")
    per_record = max_multiplicity * c
    cells = n_trees * n_features
    return Sensitivity(l1=cells * per_record, l2=math.sqrt(cells) * per_record, linf=per_record)
