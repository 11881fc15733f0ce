"""Evaluation statistics as integers: what a site uploads, and how the server reads the sum.

Every entry of an evaluation's summable vector is an integer (``StatKind.COUNT`` in the ring,
scale 1, no fractional bits), so the secure sum is exact and so is the plain sum of the open
profile (integers below 2^53 add exactly in float64).

* Counts travel as they are.
* Without DP, a real-valued sum ``S`` (per-row bound ``c``) travels as the fixed-point integer
  ``X = round(2^40 (S / c + o))``, ``o`` = the site's row count for a signed statistic (so
  ``X >= 0``), cut into three 30-bit limbs ``X = L0 + 2^30 L1 + 2^60 L2``. A site holds at most
  2^24 rows, so ``X < 2^66``; the limbs' sums over sites never wrap, and the server rebuilds the
  exact sum of the sites' ``X`` with integer arithmetic. The result differs from the float sum
  of the pooled rows by at most ``c 2^-41`` per site: ``tests/test_evaluation_metrics.py``
  checks the metrics against scikit-learn on the pooled rows (a regression's within bounds
  that scale with the target range, :mod:`.metrics`). (The limb sums show the
  server, besides the total, how often the sites' low limbs carried into the next: an integer
  below the number of sites, a function of the sums' digits below ``c 2^-10``.)
* With DP, a real-valued sum travels as one integer ``round(2^8 S / c)`` and every entry
  carries the site's discrete-Gaussian noise (:mod:`.noise`), calibrated in these units.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..errors import InvalidMessage
from .layout import EXACT_LIMBS, EvalLayout

__all__ = ["DP_FRAC_BITS", "FRAC_BITS", "decode_statistics", "encode_statistics",
           "split_statistics"]

#: Fractional bits of an exact real-valued statistic, relative to its per-row bound.
FRAC_BITS = 40
_LIMB_BITS = 30
_LIMB_MASK = (1 << _LIMB_BITS) - 1
#: Fractional bits of a real-valued statistic under DP (the noise is far coarser).
DP_FRAC_BITS = 8


def _limbs(values: np.ndarray, offset: int) -> np.ndarray:
    """Exact limbs of ``round(2^40 v) + offset * 2^40`` per value (clamped at 0)."""
    out = np.zeros((values.size, EXACT_LIMBS))
    for i, v in enumerate(values.tolist()):
        x = max(int(round(math.ldexp(v, FRAC_BITS))) + (offset << FRAC_BITS), 0)
        out[i] = (x & _LIMB_MASK, (x >> _LIMB_BITS) & _LIMB_MASK, x >> (2 * _LIMB_BITS))
    return out


def encode_statistics(layout: EvalLayout, stats: Mapping[str, np.ndarray], n_rows: int,
                      dp: bool) -> np.ndarray:
    """A site's statistics (every block with its model axis) as the integer vector it uploads
    (before any DP noise), laid out as ``layout.wire(dp)``."""
    parts = []
    for b in layout.blocks:
        arr = np.asarray(stats[b.name], dtype=np.float64).reshape(-1)
        if arr.size != layout.n_models * b.size:
            raise ValueError(f"statistics block {b.name!r} has the wrong size")
        if not b.real:
            parts.append(np.rint(arr))
        elif dp:
            parts.append(np.rint(np.ldexp(arr / b.bound, DP_FRAC_BITS)))
        else:
            parts.append(_limbs(arr / b.bound, n_rows if b.signed else 0).reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0)


def split_statistics(layout: EvalLayout, flat: np.ndarray, dp: bool) -> dict[str, np.ndarray]:
    """Cut a flat vector laid out as ``layout.wire(dp)`` into blocks of shape
    ``(n_models, *block.shape, width)``."""
    out = {}
    start = 0
    for b in layout.blocks:
        w = layout.width(b, dp)
        size = layout.n_models * b.size * w
        if start + size > flat.size:
            raise InvalidMessage("the vector is shorter than the evaluation's layout")
        out[b.name] = flat[start:start + size].reshape(layout.n_models, *b.shape, w)
        start += size
    if start != flat.size:
        raise InvalidMessage("the vector is longer than the evaluation's layout")
    return out


def decode_statistics(layout: EvalLayout, total: np.ndarray, dp: bool
                      ) -> dict[str, np.ndarray]:
    """The summed statistics (float64, blocks with their model axis) from the sum of the
    sites' uploads. Under DP they are the noisy sums as released (a noisy count may be
    negative: clipping it would bias the metrics that are linear in the counts, such as the
    AUC's numerator)."""
    if not np.isfinite(total).all():
        raise InvalidMessage("the sum has non-finite entries")
    blocks = split_statistics(layout, np.rint(np.asarray(total, dtype=np.float64)), dp)
    out: dict[str, np.ndarray] = {}
    for b in layout.blocks:
        if not b.real:
            out[b.name] = blocks[b.name][..., 0]
    rows = _rows(layout, out)
    for b in layout.blocks:
        if not b.real:
            continue
        arr = blocks[b.name]
        if dp:
            out[b.name] = np.ldexp(arr[..., 0], -DP_FRAC_BITS) * b.bound
            continue
        vals = np.zeros(arr.shape[:-1])
        flat_in = arr.reshape(layout.n_models, -1, EXACT_LIMBS)
        flat_out = vals.reshape(layout.n_models, -1)
        for m in range(layout.n_models):
            offset = int(rows[m]) << FRAC_BITS if b.signed else 0
            for i, (l0, l1, l2) in enumerate(flat_in[m].tolist()):
                x = int(l0) + (int(l1) << _LIMB_BITS) + (int(l2) << (2 * _LIMB_BITS)) - offset
                flat_out[m, i] = math.ldexp(float(x), -FRAC_BITS) * b.bound
        out[b.name] = vals
    return out


def _rows(layout: EvalLayout, counts: Mapping[str, np.ndarray]) -> np.ndarray:
    """Rows scored per model (the offset of the signed statistics)."""
    if layout.task == "classification":
        rows: np.ndarray = np.asarray(counts["confusion"]).reshape(layout.n_models, -1).sum(
            axis=1)
        return rows
    return np.asarray(counts["count"]).reshape(layout.n_models)
