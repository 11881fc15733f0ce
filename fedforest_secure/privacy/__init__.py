"""Privacy: profiles, abstention and adaptive-B rules, DP noise and the budget accountant.

Public API (everything in ``__all__``):

* :class:`PrivacyProfile`, :class:`DPConfig`, :func:`load_profile`, :func:`available_profiles`
* rules: :func:`abstains`, :func:`adaptive_n_bins`, :func:`check_profile_schema`
* DP: :class:`Sensitivity`, :func:`histogram_sensitivity`, :func:`central_sigma`,
  :func:`plan_distributed_noise`, :class:`NoisePlan`, :func:`add_distributed_noise`,
  :func:`sample_discrete_gaussian`, :class:`ChaChaRandom`, :func:`min_survivors`,
  :func:`require_dp_ready`, :func:`rho_for`, :func:`zcdp_delta`
* budget: :class:`PrivacyAccountant`, :class:`Spend`

Noisy per-client node summaries for ``h_splits = "noisy"`` live in :mod:`.hsplits` (used by the
worker and the coordinator, not re-exported).
"""

from __future__ import annotations

from .accountant import PrivacyAccountant, Spend
from .dp import (
    ChaChaRandom,
    NoisePlan,
    add_distributed_noise,
    central_sigma,
    min_survivors,
    plan_distributed_noise,
    require_dp_ready,
    rho_for,
    sample_discrete_gaussian,
    zcdp_delta,
)
from .profile import DPConfig, PrivacyProfile, available_profiles, load_profile
from .rules import abstains, adaptive_n_bins, check_profile_schema
from .sensitivity import Sensitivity, histogram_sensitivity

__all__ = [
    "ChaChaRandom",
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
    "central_sigma",
    "check_profile_schema",
    "histogram_sensitivity",
    "load_profile",
    "min_survivors",
    "plan_distributed_noise",
    "require_dp_ready",
    "rho_for",
    "sample_discrete_gaussian",
    "zcdp_delta",
]
