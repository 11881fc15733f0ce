"""Warnings of ``fedforest check`` about a column's spread at a site against its public bounds.

Under the secure profiles the bounds fix what the federation can resolve, whatever the data:

* a regression target's sums of y and y^2 go through the fixed-point ring in steps of the
  bounds' half-width (squared, for y^2) times ``2^-frac_bits``; a node's variance shows in its
  sums only when it spans several steps, so a target whose spread is a small fraction of
  its bounds' half-width loses its smaller nodes' splits (bounds [0, 1e8] on targets of
  standard deviation 1,000: test R^2 0.81 against 0.99 with bounds [0, 1e5]);
* in every profile, the sites centre the target on its bounds' middle before taking sums, and
  a node is pure when its ``n * Var`` is below
  :data:`~fedforest_secure._leaves.PURE_TOLERANCE` times its sum of centred y^2 (float
  rounding): a target whose values lie far from that middle compared with their spread loses
  its nodes' splits whatever the profile (bounds [0, 1e8] on targets of 100 +- 10: every tree
  a single leaf, open profile included);
* a feature's secure pooled-CDF sketch cuts no cell narrower than
  :data:`~fedforest_secure._secure_cdf.MIN_CELL` of its bounds' width: a feature whose middle
  half of distinct values spans less is split on rarely or never (the estimators warn the same,
  :func:`~fedforest_secure._estimator_inputs.warn_unresolved`).
"""

from __future__ import annotations

import math

import numpy as np

from ._leaves import PURE_TOLERANCE
from ._secure_cdf import MIN_CELL

__all__ = ["DEFAULT_FRAC_BITS", "feature_spread_problem", "target_spread_problem"]

#: the profiles' ``frac_bits`` unless a profile sets another
DEFAULT_FRAC_BITS = 24
#: a target's variance must span this many steps of the ring's y^2 encoding
_STEPS = 4


def target_spread_problem(values: list[float], bounds: tuple[float, float],
                          frac_bits: int = DEFAULT_FRAC_BITS) -> tuple[str, str] | None:
    """(what, advice) when the site's target spread is too small for its bounds' fixed-point
    scale, or the bulk of its values too far from their middle for float rounding (module
    docstring), or None."""
    if len(values) < 2:
        return None
    lo, hi = bounds
    middle = lo / 2.0 + hi / 2.0
    half = max(hi - middle, middle - lo)
    far = _far_from_middle(np.asarray(values, dtype=np.float64), middle)
    step = half * half * 2.0 ** -frac_bits  # one ring unit of a sum of y^2
    sd = float(np.std(np.asarray(values, dtype=np.float64)))
    if sd == 0.0 or sd * sd >= _STEPS * step:
        return far
    limit = half * math.sqrt(_STEPS * 2.0 ** -frac_bits)
    return (f"its standard deviation at this site ({sd:.3g}) is below {limit:.3g}, "
            f"1/{half / limit:.0f} of the half-width of its bounds [{lo:g}, {hi:g}]: under a "
            f"secure profile (frac_bits {frac_bits}) the sites' sums of y^2 are kept in steps "
            f"of {step:.3g}, too coarse for the target's variance in small nodes, and the "
            "trees lose splits"
            + ("" if far is None else f"; {far[0][0].lower()}{far[0][1:]}"),
            "ask the federation to narrow the target's bounds in schema.toml to its plausible "
            "range (every site's values must lie within them), or to rescale the target")


def _far_from_middle(values: np.ndarray, middle: float) -> tuple[str, str] | None:
    """(what, advice) when the middle half of ``values`` (interquartile range, as a standard
    deviation) is below ten times the spread the purity test takes for float rounding at
    their median's distance from ``middle`` (module docstring), or None."""
    q1, median, q3 = (float(q) for q in np.percentile(values, [25.0, 50.0, 75.0]))
    sd = (q3 - q1) / 1.349
    floor = math.sqrt(PURE_TOLERANCE) * abs(median - middle)
    if sd <= 0.0 or sd >= 10.0 * floor:
        return None
    return (f"the middle half of its values at this site spreads about {sd:.3g} (as a "
            f"standard deviation) around {median:.6g}, far from the middle of its bounds "
            f"({middle:.6g}) that the sites centre it on: in every profile a node whose "
            f"spread is below about {floor:.3g} there reads as pure (float rounding of the "
            "sums of y^2), and the trees stop splitting",
            "ask the federation to narrow the target's bounds in schema.toml to its plausible "
            "range (every site's values must lie within them), or to rescale the target "
            "(e.g. a log)")


def feature_spread_problem(values: list[float], bounds: tuple[float, float]
                           ) -> tuple[str, str] | None:
    """(what, advice) when the middle half of the site's distinct values spans less than the
    secure sketch's narrowest cell (module docstring), or None."""
    distinct = np.unique(np.asarray(values, dtype=np.float64))
    if distinct.size < 2:
        return None
    q1, q3 = (float(q) for q in np.percentile(distinct, [25.0, 75.0]))
    lo, hi = bounds
    if q3 - q1 >= MIN_CELL * (hi - lo):
        return None
    return (f"the middle half of its distinct values at this site spans {q3 - q1:.3g}, less "
            f"than {MIN_CELL:g} of the width of its bounds [{lo:g}, {hi:g}]: the secure "
            "sketch cuts no finer, so the forest may split on it rarely or never",
            "ask the federation to narrow the feature's bounds in schema.toml to its plausible "
            "range, or to transform the feature (e.g. a log)")
