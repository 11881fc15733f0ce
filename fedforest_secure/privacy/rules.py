"""Small privacy rules shared by worker and coordinator: abstention, adaptive B, schema needs.

* Minimum-leaf abstention: a client with fewer than ``abstain_below`` rows at a node contributes
  nothing for that node (a zero vector, still masked, so abstaining is not visible).
* Adaptive B: a sketch never has more points than the rows it summarises allow,
  ``B_nu = min(B, floor(n_min / rows_per_sketch_point))`` where ``n_min`` is the smallest row
  count it summarises (for per-client sketches the client's rows, with ``rows_per_sketch_point``
  >= 2 its distinct rows, a row the bootstrap drew several times counting once; the pooled
  count for the secure CDF sketch).
* Profile/schema compatibility: the secure CDF sketch needs public feature bounds (its grid lives
  in the node's box), fixed-point encoding of a regression target needs its bounds (scales and
  range checks), differential privacy needs all bounds (sensitivities).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ProfileError
from .dp import require_dp_ready

if TYPE_CHECKING:
    from ..schema import Schema
    from .profile import PrivacyProfile

__all__ = ["abstains", "adaptive_n_bins", "check_profile_schema"]


def abstains(n_rows: int, profile: PrivacyProfile) -> bool:
    """Whether a client with ``n_rows`` distinct rows at a node abstains for that node."""
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    return n_rows < profile.abstain_below


def adaptive_n_bins(n_bins: int, n_rows: int, profile: PrivacyProfile) -> int:
    """Sketch size for a node whose sketch summarises ``n_rows`` rows (at least its smallest).

    Parameters
    ----------
    n_bins : int
        Requested sketch size ``B`` (>= 2).
    n_rows : int
        Rows the sketch summarises (>= 0).

    Returns
    -------
    int
        ``min(B, n_rows // rows_per_sketch_point)``; below 2 no split candidate can be formed
        and the caller treats the node as a leaf.
    """
    if not isinstance(n_bins, int) or n_bins < 2:
        raise ProfileError(f"n_bins (sketch size B) must be an int >= 2, got {n_bins!r}")
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    return min(n_bins, n_rows // profile.rows_per_sketch_point)


def check_profile_schema(profile: PrivacyProfile, schema: Schema) -> None:
    """Refuse a profile whose protections need public bounds the schema does not give.

    Raises
    ------
    ProfileError
        ``sketch = "secure_cdf"`` without bounds on every continuous feature, or
        ``fixed_point = true`` without bounds on a regression target.
    BudgetError
        A DP profile with any bound missing (:func:`~.dp.require_dp_ready`).
    """
    if profile.dp is not None:
        require_dp_ready(profile, schema)
    feats = [f.name for f in schema.features if f.kind == "continuous" and f.bounds is None]
    if profile.sketch == "secure_cdf" and feats:
        raise ProfileError(
            f'profile {profile.name!r} uses sketch = "secure_cdf", which needs public bounds '
            f"for the continuous features {feats}"
        )
    t = schema.target
    if profile.fixed_point and t.kind == "regression" and t.bounds is None:
        raise ProfileError(
            f"profile {profile.name!r} uses fixed_point = true, which needs public bounds for "
            f"the regression target {t.name!r}"
        )
