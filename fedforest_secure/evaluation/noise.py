"""DP noise of an evaluation: sensitivities of its statistics and one calibrated release.

An evaluation under a DP profile releases one noisy sum (every model's statistics of one round),
``(epsilon, delta)``-DP for adding or removing one held-out record. Each site adds
``N_Z(0, sigma_b^2)`` to every entry of block ``b`` of its integer vector (:mod:`.encoding`)
before masking; the sum carries the calibrated noise as long as ``K_min`` sites contribute
(:func:`~fedforest_secure.privacy.min_survivors`). The scales come from the job's public
configuration alone, so every site computes its own and the server cannot lower them.

Sensitivity, in the integer units of the upload, of block ``b`` over ``M`` models (``l1``,
``l2``, ``touched`` from :mod:`.layout`): counts ``L1 = M l1``, ``L2 = sqrt(M) l2``; a real sum
is ``round(2^8 S / c)`` with each row's contribution clipped to ``c``, so one record moves a
touched entry by at most ``2^8 |contribution| / c + 1`` (the ``+ 1``: the rounding of the
site's sum), ``L1 = M (2^8 l1 + touched)``, ``L2 = sqrt(M) (2^8 l2 + sqrt(touched))``.

The budget is shared equally by the blocks (one zCDP share each) and calibrated in one go by
:func:`~fedforest_secure.privacy.allocation.calibrate`, the engine's calibration, so the release
spends exactly (epsilon, delta) in the accountant's Rényi accounting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from ..errors import BudgetError
from ..privacy.sensitivity import Sensitivity, abstention_factor
from .encoding import DP_FRAC_BITS
from .layout import EvalLayout, StatBlock, eval_layout
from .spec import EvalSpec

if TYPE_CHECKING:
    # the DP machinery (diffprivlib, SciPy) is imported on first use: an evaluation without
    # DP never loads it
    from ..config import JobConfig
    from ..privacy.accountant import Cost
    from ..privacy.allocation import PlannedRelease

__all__ = ["EvalNoise", "block_sensitivity", "config_layout", "eval_noise"]


def block_sensitivity(layout: EvalLayout, block: StatBlock, dp: bool = True) -> Sensitivity:
    """How far one record moves ``block`` of every model, in upload units (module docstring)."""
    m = layout.n_models
    if not block.real:
        return Sensitivity(l1=m * block.l1, l2=math.sqrt(m) * block.l2, linf=1.0)
    unit = float(2**DP_FRAC_BITS) if dp else 1.0
    rounding = 1.0 if dp else 0.0
    return Sensitivity(l1=m * (unit * block.l1 + rounding * block.touched),
                       l2=math.sqrt(m) * (unit * block.l2 + rounding * math.sqrt(block.touched)),
                       linf=unit + rounding)


def config_layout(config: JobConfig) -> EvalLayout:
    """The statistics layout of an evaluation job."""
    return eval_layout(EvalSpec.of(config), config.task, config.n_classes,
                       config.target_bound, config.dp is not None,
                       target_offset=config.target_offset)


@dataclass(frozen=True)
class EvalNoise:
    """The noise of an evaluation's release.

    Attributes
    ----------
    release : PlannedRelease
        Its blocks with their sensitivities (upload units) and budget shares.
    sigmas : dict of str to float
        Each site's noise scale per block, in upload units.
    k_min : int
        Contributing sites the noise is calibrated for; fewer must not be released.
    epsilon, delta : float
    """

    release: PlannedRelease
    sigmas: dict[str, float]
    k_min: int
    epsilon: float
    delta: float

    def cost(self) -> Cost:
        """The release's Rényi bound (what the accountant records)."""
        from ..privacy.allocation import release_cost

        return release_cost(self.release, [self.sigmas[b.name] for b in self.release.blocks])

    def sum_std(self, layout: EvalLayout, contributors: int) -> dict[str, float]:
        """Standard deviation of the noise on one entry of each block of the sum, in the
        statistic's own units (rows, or the real sum's units), when ``contributors`` sites
        each add their share."""
        out = {}
        for b in layout.blocks:
            unit = b.bound * 2.0**-DP_FRAC_BITS if b.real else 1.0
            out[b.name] = self.sigmas[b.name] * math.sqrt(max(contributors, 0)) * unit
        return out

    def sample(self, layout: EvalLayout) -> np.ndarray:
        """One site's noise vector, laid out as ``layout.wire(dp=True)`` (fresh randomness from
        a cryptographic source)."""
        from ..privacy import sample_discrete_gaussian

        parts = []
        for b in layout.blocks:
            size = layout.n_models * b.size
            sigma = float(self.sigmas[b.name])
            parts.append(sample_discrete_gaussian(sigma, size).astype(np.float64)
                         if sigma > 0 else np.zeros(size))
        return np.concatenate(parts)


def eval_noise(config: JobConfig) -> EvalNoise:
    """The noise of a DP evaluation job, from its public configuration (cached)."""
    return _eval_noise(config.to_json())


@lru_cache(maxsize=8)
def _eval_noise(config_json: str) -> EvalNoise:
    from ..config import JobConfig
    from ..privacy.allocation import PlannedBlock, PlannedRelease, calibrate
    from ..privacy.dp import honest_noise_adders, min_survivors

    config = JobConfig.from_json(config_json)
    dp = config.dp
    if not dp:
        raise BudgetError("the evaluation's profile has no [dp] section: no budget")
    eps, delta = float(dp["epsilon"]), float(dp["delta"])
    tol = dp.get("dropout_tolerance")
    if tol is None:
        tol = max(0.0, 1.0 - float(config.profile.get("threshold", 1.0)))
    k_min = min_survivors(config.n_clients, min(float(tol), 0.999))
    layout = config_layout(config)
    share = 1.0 / len(layout.blocks)
    # a site below abstain_below sends zeros: one record can bring (or take) m rows at once
    factor = float(abstention_factor(config.profile))
    blocks = tuple(PlannedBlock(b.name, block_sensitivity(layout, b).scaled(factor),
                                layout.n_models * b.size, share) for b in layout.blocks)
    # the noise holds for the honest survivors: K_min less the colluders
    honest = honest_noise_adders(config.n_clients, k_min, dp.get("colluders", 0),
                                 threshold=float(config.profile.get("threshold", 1.0)),
                                 neighbours=config.profile.get("neighbours"))
    release = PlannedRelease("evaluation", honest, blocks)
    (sigmas,) = calibrate([release], eps, delta)
    return EvalNoise(release, {b.name: s for b, s in zip(blocks, sigmas, strict=True)}, k_min,
                     eps, delta)
