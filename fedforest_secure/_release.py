"""The coordinator's release policy: what a job's rounds release, and with what noise.

The privacy profile names what may leave a client beyond masked sums; this object turns it into
the engine's decisions and keeps the budget:

* which sketch the quantile-based methods use (the paper's per-client quantiles, disclosed, or
  the secure pooled-CDF sketch) and the adaptive-B rule (``rows_per_sketch_point``);
* whether splits on the client indicator H are scored, on clear or on noisy per-client node
  summaries (``h_splits``);
* which rounds release node totals: every sketch round, none under differential privacy (one
  noisy histogram round per level; node totals and leaf values come from those histograms),
  and with random splits (``method = "random"``) the last level's only (plus one round of
  per-feature marginal counts at the first level, which sets the thresholds and, for DP
  classification at small epsilon, carries the classes' row totals);
* under differential privacy: the budget share and the noise scales of every release
  (recorded in :attr:`ReleasePolicy.spends` for the audit log), the clients a noisy sum needs,
  and the post-processing of noisy statistics into node values.

Configurations that would release more than the profile allows fail here, before any round.
The noise itself is added by every client from its own profile
(:func:`~fedforest_secure.secure_sum.noise_sigmas`,
:mod:`~fedforest_secure.privacy.hsplits`); what this object publishes is informational.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import _impurity, _splits
from .config import JobConfig
from .errors import BudgetError, ProfileError, ProtocolError
from .privacy.profile import with_profile_defaults
from .protocol import Block, TaskKind

if TYPE_CHECKING:
    from .privacy.accountant import PrivacyAccountant

__all__ = ["ReleasePolicy"]


class ReleasePolicy:
    """What the coordinator releases and with what noise (module docstring).

    Raises
    ------
    ProfileError
        The job asks for something the profile does not release (H-splits with
        ``h_splits = "off"``, the exact method under secure aggregation, the secure sketch or
        random splits without public feature bounds, random splits on the client).
    BudgetError
        Differential privacy without public bounds, noisy H-splits without a budget, or a
        budget whose noise scales the sampler cannot draw at the profile's ``frac_bits``.
    """

    def __init__(self, config: JobConfig) -> None:
        self.config = config
        # a setting the profile leaves out is PrivacyProfile's default, as the sites read it
        prof = with_profile_defaults(config.profile)
        #: "quantiles" (per-client sketches, disclosed) or "secure_cdf" (pooled, summed)
        self.sketch = str(prof.get("sketch", "quantiles"))
        #: adaptive B: a sketch point summarises at least this many rows (0: no rule)
        self.rows_per_point = int(prof.get("rows_per_sketch_point", 0) or 0)
        h_policy = str(prof.get("h_splits", "clear"))
        if config.split_on_client and h_policy == "off":
            how = ("h_splits='off' (as 'secure' and 'secure-dp' have)"
                   if "h_splits" in config.profile else
                   "no h_splits, which means 'off' (its default, as the sites read it)")
            raise ProfileError(
                f"split_on_client=True but the privacy profile has {how}: set "
                "h_splits='clear' (each site's exact node summaries "
                "are disclosed, as in the open profile) or, with [dp], h_splits='noisy' and "
                "dp.h_epsilon (docs/privacy.md §2.5), or train with split_on_client=False")
        #: H-splits are scored from per-client node summaries
        self.h_splits = bool(config.split_on_client and h_policy in ("clear", "noisy"))
        #: h_splits = "noisy": the per-client node summaries carry each client's own DP noise
        #: (privacy/hsplits.py); they need a budget, so without [dp] the job fails closed
        self.noisy_h = bool(config.split_on_client and h_policy == "noisy")
        if self.noisy_h and config.dp is None:
            raise BudgetError("h_splits='noisy' adds DP noise to per-client node summaries and "
                              "needs a [dp] budget (dp.epsilon and dp.h_epsilon); refusing to "
                              "train without one")
        if config.method == "exact" and prof.get("secure_aggregation"):
            raise ProfileError("method='exact' discloses every node value; use the open profile")
        if config.method == "avgimp" and config.top_l is not None \
                and prof.get("secure_aggregation"):
            # the sites refuse it: they disclose nothing in the clear under secure aggregation
            # but what the profile names (sketch points, node summaries)
            raise ProfileError("method='avgimp' with top_l discloses each site's top-L "
                               "features in the clear, which a profile with secure aggregation "
                               "never does; leave top_l out (the gains are summed securely) or "
                               "use the open profile")
        if self.sketch == "secure_cdf" and config.method in ("quantiles", "avgimp"):
            if config.feature_bounds is None:
                raise ProfileError("the secure_cdf sketch needs public feature bounds "
                                   "(set them in the schema)")
        #: random splits: the marginal counts (level 0) and the leaves' totals release
        self.random_splits = config.method == "random"
        if self.random_splits and config.feature_bounds is None:
            raise ProfileError("method='random' draws thresholds inside the public feature "
                               "bounds; set them in the schema")
        if self.random_splits and config.split_on_client:
            raise ProfileError("method='random' does not split on the client")
        dp = config.dp
        #: every release is noised (the profile has a [dp] section)
        self.dp = dp is not None
        #: a DP random-split classifier's node values under uniform class priors ("uniform")
        #: or the rows' class frequencies ("rows"): the profile's ``dp.class_priors``
        self.class_priors = str((dp or {}).get("class_priors", "uniform"))
        #: the job's budget (None without DP)
        self.accountant: PrivacyAccountant | None = None
        if dp is not None:
            if config.feature_bounds is None or (config.task == "regression"
                                                 and not config.target_bound > 0):
                raise BudgetError("differential privacy needs public feature and target bounds; "
                                  "refusing to infer them from data")
            from .privacy.hsplits import job_budget

            # releases: one histogram round per level; node and leaf values come from the same
            # noisy histograms, so no other round releases anything, except (noisy H-splits)
            # one set of noisy per-client node summaries per splitting level
            self.accountant = job_budget(dp, config.max_depth, noisy_h=self.noisy_h).accountant()
            # every noise scale the clients will draw is one the sampler can (BudgetError here,
            # before any round, not at the sampler mid-job)
            from .privacy.allocation import job_noise
            from .secure_sum import noise_units

            job_noise(config, noise_units(config))
            if self.noisy_h:
                from .privacy.hsplits import node_stats_noise

                node_stats_noise(config)
        #: every DP release: round, budget share, running totals, noise scales
        self.spends: list[dict[str, Any]] = []
        self._k_min = 0

    # ------------------------------------------------------------------ what is released
    def totals_in_sketch(self, last: bool) -> bool:
        """Whether a level's sketch round (``last``: of the last level) releases node totals.
        Under DP it releases nothing: node totals come from the (noisy) histogram of the same
        level and leaf values from the parent's, which saves budget. Random splits release
        the leaves' totals only (their thresholds come from the marginal counts of level 0's
        histogram round)."""
        return last if self.random_splits else not self.dp

    @property
    def groups_allowed(self) -> bool:
        """Whether a level may be evaluated in groups of nodes: not under DP (every histogram
        round spends budget)."""
        return not self.dp

    # ------------------------------------------------------------------ noise and budget
    def noise_params(self, round_id: int, kind: TaskKind, level: int,
                     layout: tuple[Block, ...]) -> dict[str, Any]:
        """Spend one round's budget share; the noise scales (which every client recomputes
        from its own profile, see :func:`~fedforest_secure.secure_sum.noise_sigmas`) are
        published in the task and the audit log for transparency only."""
        from . import secure_sum
        from .privacy.allocation import job_noise

        accountant = self._require_accountant()
        sigmas, k_min = secure_sum.noise_sigmas(self.config, layout, level)
        dims: dict[str, int] = {}
        for b in layout:
            per = b.size // max(len(b.kinds), 1)
            for k in b.kinds:
                dims[k.value] = dims.get(k.value, 0) + per
        cost = job_noise(self.config, secure_sum.noise_units(self.config)).cost(level, dims)
        spend = accountant.spend(f"round {round_id} ({kind.value}, level {level})",
                                 cost, mechanism="gaussian_discrete (distributed)")
        self._k_min = k_min
        self.spends.append({"round": round_id, "kind": kind.value, "level": level,
                            "epsilon": spend.epsilon, "delta": spend.delta,
                            "rho": spend.rho, "xi": spend.xi,
                            "mechanism": "gaussian_discrete (distributed)",
                            "total_epsilon": spend.total_epsilon,
                            "total_delta": spend.total_delta, "sigma_client": sigmas})
        return {"sigma": sigmas, "epsilon": spend.epsilon, "delta": spend.delta,
                "rho": spend.rho, "xi": spend.xi, "total_epsilon": spend.total_epsilon}

    def spend_node_stats(self, round_id: int, level: int, n_nodes: int) -> None:
        """Noisy H-splits: charge this round's per-client node summaries (each client adds
        local noise for its own release, see :mod:`~fedforest_secure.privacy.hsplits`)."""
        from .privacy.hsplits import node_stats_noise

        accountant = self._require_accountant()
        noise = node_stats_noise(self.config, n_nodes)
        spend = accountant.spend(
            f"round {round_id} (node_stats, level {level})", noise.cost,
            mechanism="gaussian_discrete (local, per client)")
        self.spends.append({"round": round_id, "kind": "node_stats", "level": level,
                            "epsilon": spend.epsilon, "delta": spend.delta,
                            "rho": spend.rho, "xi": spend.xi,
                            "mechanism": "gaussian_discrete (local, per-client node summaries)",
                            "total_epsilon": spend.total_epsilon,
                            "total_delta": spend.total_delta,
                            "sigma_client": {"node_stats": noise.sigma_values.tolist()}})

    def _require_accountant(self) -> PrivacyAccountant:
        if self.accountant is None:
            raise BudgetError("this job has no [dp] budget to spend")
        return self.accountant

    def leaf_min_count(self) -> float:
        """Random splits: the count below which a node takes its ancestor's value. Under DP
        a regression leaf's mean also needs a count above the noise on it (one standard
        deviation of the summed count noise)."""
        cfg = self.config
        floor = float(max(cfg.min_samples_leaf, 1))
        if not self.dp or cfg.task != "regression":
            return floor
        from . import secure_sum
        from .privacy.allocation import job_noise

        plan = job_noise(cfg, secure_sum.noise_units(cfg))
        return max(floor, plan.sum_count_std(cfg.max_depth, cfg.n_clients))

    def leaf_shrinkage(self) -> float:
        """Random-split classification under DP: the pseudo-rows of its parent's proportions a
        node's class counts get (:func:`~fedforest_secure._random_splits.values_from_leaves`,
        post-processing): :data:`~fedforest_secure.privacy.allocation.LEAF_SHRINK` times the
        standard deviation of the summed noise on one class count of the leaves' release.
        0 without DP, for regression or with ``LEAF_SHRINK = 0`` (as shipped): the
        ``leaf_min_count`` rule then applies."""
        from .privacy.allocation import LEAF_SHRINK

        std = self.leaf_vote_noise() if LEAF_SHRINK > 0 else None
        return 0.0 if std is None else LEAF_SHRINK * std

    def soft_routing_width(self) -> float:
        """Random-split classification under DP: the width of the forest's soft routing at
        prediction (:data:`~fedforest_secure.privacy.allocation.SOFT_ROUTING_WIDTH`,
        :mod:`~fedforest_secure._soft_routing`); 0 otherwise (hard splits)."""
        if not (self.dp and self.random_splits and self.config.task == "classification"):
            return 0.0
        from .privacy.allocation import SOFT_ROUTING_WIDTH

        return float(SOFT_ROUTING_WIDTH)

    def class_prior_noise(self) -> float | None:
        """Random-split classification under DP with the profile's ``dp.class_priors =
        "uniform"`` (and :data:`~fedforest_secure.privacy.allocation.LEAF_CLASS_BALANCED`, as
        shipped): the noise :func:`~fedforest_secure._random_splits.class_weights` assumes on
        one leaf class count (:data:`~fedforest_secure.privacy.allocation.CLASS_PRIOR_NOISE_MULT`
        times :meth:`leaf_vote_noise`); None otherwise (node values under the rows' class
        frequencies)."""
        from .privacy.allocation import CLASS_PRIOR_NOISE_MULT, LEAF_CLASS_BALANCED

        std = self.leaf_vote_noise()
        if std is None or not LEAF_CLASS_BALANCED or self.class_priors != "uniform":
            return None
        return CLASS_PRIOR_NOISE_MULT * std

    def class_totals_scale(self) -> int:
        """DP random-split classification at small epsilon: how many times its classes' row
        totals a client adds to the level-0 marginal counts
        (:func:`~fedforest_secure.privacy.allocation.class_totals_scale`); 0 when the plan
        releases no class totals."""
        if not (self.dp and self.random_splits):
            return 0
        from .privacy.allocation import class_totals_scale

        return class_totals_scale(self.config)

    def class_totals_noise(self) -> float | None:
        """With :meth:`class_totals_scale` ``a >= 1`` and :meth:`class_prior_noise` not None:
        the noise :func:`~fedforest_secure._random_splits.class_weights` assumes on one class
        total of that release, :data:`~fedforest_secure.privacy.allocation.CLASS_TOTALS_NOISE_MULT`
        times its standard deviation (the summed noise on one count of the level-0 release,
        over ``a``); None otherwise."""
        a = self.class_totals_scale()
        if a < 1 or self.class_prior_noise() is None:
            return None
        from . import secure_sum
        from .privacy.allocation import CLASS_TOTALS_NOISE_MULT, job_noise

        cfg = self.config
        plan = job_noise(cfg, secure_sum.noise_units(cfg))
        return CLASS_TOTALS_NOISE_MULT * plan.sum_count_std(0, cfg.n_clients) / a

    def leaf_vote_noise(self) -> float | None:
        """Random-split classification under DP: the standard deviation of the noise on one
        summed class count of the leaves' release, which decides with the rows per leaf
        whether the forest votes with summed counts
        (:func:`~fedforest_secure.privacy.allocation.leaf_votes_are_counts`); None otherwise
        (the forest averages its trees' class proportions)."""
        cfg = self.config
        if not (self.dp and self.random_splits and cfg.task == "classification"):
            return None
        from . import secure_sum
        from .privacy.allocation import job_noise

        plan = job_noise(cfg, secure_sum.noise_units(cfg))
        return plan.sum_count_std(cfg.max_depth, cfg.n_clients)

    def marginal_floor(self) -> float:
        """Random splits: what every bin of the marginal counts gets after clipping at 0
        (:func:`~fedforest_secure._random_splits.marginal_cdf`, post-processing):
        :data:`~fedforest_secure.privacy.allocation.MARGINAL_FLOOR` rows."""
        from .privacy.allocation import MARGINAL_FLOOR

        return MARGINAL_FLOOR

    def check_participants(self, layout: tuple[Block, ...], n_participants: int) -> None:
        """A noisy sum over fewer clients than its noise is calibrated for is not released.

        Raises
        ------
        ProtocolError
            Under DP, a round with a summable layout and fewer than ``K_min`` participants.
        """
        if self.dp and layout and n_participants < self._k_min:
            raise ProtocolError(f"{n_participants} clients contributed; the DP noise is "
                                f"calibrated for at least {self._k_min}: sum not released")

    # ------------------------------------------------------------------ post-processing
    def node_values(self, stats: np.ndarray, fallback: np.ndarray) -> np.ndarray:
        """Node values from noisy statistics: the parent's value where the noisy count is too
        small to trust (below ``min_samples_leaf``), regression means clipped to the public
        target bounds and class proportions kept non-negative (post-processing)."""
        cfg = self.config
        n = _impurity.counts_of(stats, cfg.task)
        values = _impurity.node_values(stats, cfg.task)
        weak = n < max(cfg.min_samples_leaf, 1)
        values[weak] = fallback[weak]
        if cfg.task == "regression":
            np.clip(values, -cfg.target_bound, cfg.target_bound, out=values)
        return values

    def client_summaries(self, per_client: np.ndarray) -> np.ndarray:
        """Per-client node summaries as H-splits score them: noisy ones made consistent
        (post-processing, no privacy cost), clear ones as they are."""
        if not self.noisy_h:
            return per_client
        cfg = self.config
        return _splits.clean_noisy_groups(
            per_client, cfg.task, cfg.target_bound if cfg.task == "regression" else None)
