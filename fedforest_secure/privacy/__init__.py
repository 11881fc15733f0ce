"""Privacy: profiles, abstention and adaptive-B rules, DP noise and the budget accountant.

Public API (everything in ``__all__``):

* :class:`PrivacyProfile`, :class:`DPConfig`, :func:`load_profile`, :func:`available_profiles`
* rules: :func:`abstains`, :func:`adaptive_n_bins`, :func:`check_profile_schema`
* DP: :class:`Sensitivity`, :func:`histogram_sensitivity`, :func:`central_sigma`,
  :func:`plan_distributed_noise`, :class:`NoisePlan`, :func:`add_distributed_noise`,
  :func:`sample_discrete_gaussian`, :class:`ChaChaRandom`, :func:`min_survivors`,
  :func:`require_dp_ready`, :func:`rho_for`, :func:`zcdp_delta`
* budget: :class:`PrivacyAccountant`, :class:`Spend`, :class:`ZCdp`, :class:`Cost`,
  :func:`epsilon_of`, :func:`ddg_cost`
* allocation: :func:`dp_forest_settings`, :func:`calibrate`, :func:`job_noise`

Noisy per-client node summaries for ``h_splits = "noisy"`` live in :mod:`.hsplits` (used by the
worker and the coordinator, not re-exported).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

# profiles are needed by every job; the DP machinery (diffprivlib, SciPy, cryptography's
# ChaCha20) is imported on first use of one of its names, so an open-profile job never loads it
from .profile import DPConfig, PrivacyProfile, available_profiles, load_profile

if TYPE_CHECKING:
    from .accountant import Cost, PrivacyAccountant, Spend, ZCdp, epsilon_of
    from .allocation import calibrate, dp_forest_settings, job_noise
    from .dp import (
        ChaChaRandom,
        NoisePlan,
        add_distributed_noise,
        central_sigma,
        ddg_cost,
        min_survivors,
        plan_distributed_noise,
        require_dp_ready,
        rho_for,
        sample_discrete_gaussian,
        zcdp_delta,
    )
    from .rules import abstains, adaptive_n_bins, check_profile_schema
    from .sensitivity import Sensitivity, histogram_sensitivity

_LAZY = {
    "PrivacyAccountant": "accountant", "Spend": "accountant", "ZCdp": "accountant",
    "Cost": "accountant", "epsilon_of": "accountant", "ddg_cost": "dp",
    "calibrate": "allocation", "dp_forest_settings": "allocation", "job_noise": "allocation",
    "ChaChaRandom": "dp", "NoisePlan": "dp", "add_distributed_noise": "dp",
    "central_sigma": "dp", "min_survivors": "dp", "plan_distributed_noise": "dp",
    "require_dp_ready": "dp", "rho_for": "dp", "sample_discrete_gaussian": "dp",
    "zcdp_delta": "dp",
    "abstains": "rules", "adaptive_n_bins": "rules", "check_profile_schema": "rules",
    "Sensitivity": "sensitivity", "histogram_sensitivity": "sensitivity",
}


if not TYPE_CHECKING:  # to mypy, the names are the imports above: a misspelt one is an error
    __getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())


__all__ = [
    "ChaChaRandom",
    "Cost",
    "DPConfig",
    "NoisePlan",
    "PrivacyAccountant",
    "PrivacyProfile",
    "Sensitivity",
    "Spend",
    "abstains",
    "adaptive_n_bins",
    "add_distributed_noise",
    "available_profiles",
    "calibrate",
    "central_sigma",
    "check_profile_schema",
    "ddg_cost",
    "dp_forest_settings",
    "epsilon_of",
    "histogram_sensitivity",
    "job_noise",
    "load_profile",
    "min_survivors",
    "plan_distributed_noise",
    "require_dp_ready",
    "rho_for",
    "sample_discrete_gaussian",
    "zcdp_delta",
    "ZCdp",
]
