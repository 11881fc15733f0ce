"""The server side of an evaluation job: one round, the sum, the metrics.

:class:`EvalCoordinator` speaks the training :class:`~fedforest_secure.coordinator.Coordinator`'s
driving API (``next_task``, ``submit``, ``result``, ``pop_events``, ``done``), so the same
server rounds, secure aggregation, deadlines, replay and audit log run an evaluation job. It
issues one ``evaluate`` task (no arrays: the models are in the job's configuration), receives
the sum of the sites' integer statistics (:mod:`.encoding`), and turns it into an
:class:`~.result.EvalResult`. Under a DP profile it charges the release to a
:class:`~fedforest_secure.privacy.PrivacyAccountant` when it issues the task (reported as a
``dp_spend`` event), refuses a sum over fewer than ``K_min`` sites, and reports for every
metric the standard deviation the calibrated noise gives it.

It sees sums only (and the per-site statistics that sites whose profile allows it disclosed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidMessage, ProtocolError
from ..protocol import Task, TaskKind, allowed_disclosures, check_disclosures, layout_size
from .encoding import decode_statistics
from .noise import config_layout, eval_noise
from .result import EvalResult, build_result
from .spec import EvalSpec

if TYPE_CHECKING:
    from ..config import JobConfig
    from ..privacy.accountant import PrivacyAccountant

__all__ = ["EvalCoordinator"]

#: The disclosure item a site's own statistics travel under (as :mod:`.worker` names it).
_SITE_STATS = "site_stats"


class EvalCoordinator:
    """Drive one evaluation job (see the module docstring)."""

    def __init__(self, config: JobConfig) -> None:
        self.config = config
        self.spec = EvalSpec.of(config)
        self.spec.check_models(config.task, config.n_features, config.n_classes)
        self.layout = config_layout(config)
        self._dp = config.dp is not None
        self.dp_spends: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []
        self._events_seen = (0, 0)
        self.accountant: PrivacyAccountant | None = None
        params: dict[str, Any] = {}
        if self._dp:
            params["dp"] = self._spend()
        self._pending: Task | None = Task(
            job_id=config.job_id, round_id=1, kind=TaskKind.EVALUATE, level=0, params=params,
            layout=self.layout.wire(self._dp),
            disclose=(_SITE_STATS,) if self.spec.per_site else ())
        self._result: EvalResult | None = None

    def _spend(self) -> dict[str, Any]:
        """Charge the one release to the job's accountant (fails closed past the budget)."""
        from ..privacy.accountant import PrivacyAccountant

        noise = eval_noise(self.config)
        self.accountant = PrivacyAccountant(noise.epsilon, noise.delta)
        spend = self.accountant.spend("round 1 (evaluate)", noise.cost(),
                                      mechanism="gaussian_discrete (distributed)")
        self.dp_spends.append({"round": 1, "kind": TaskKind.EVALUATE.value, "level": 0,
                               "epsilon": spend.epsilon, "delta": spend.delta,
                               "rho": spend.rho, "xi": spend.xi,
                               "mechanism": "gaussian_discrete (distributed)",
                               "total_epsilon": spend.total_epsilon,
                               "total_delta": spend.total_delta,
                               "sigma_client": dict(noise.sigmas)})
        return {"sigma": dict(noise.sigmas), "k_min": noise.k_min, "epsilon": spend.epsilon,
                "delta": spend.delta, "total_epsilon": spend.total_epsilon}

    # ------------------------------------------------------------------ driving API
    def next_task(self) -> Task | None:
        """The evaluation task, or None once its sum was submitted."""
        return self._pending

    def submit(self, round_id: int, total: np.ndarray,
               disclosed: Mapping[int, Mapping[str, np.ndarray]] | None = None,
               participants: Sequence[int] | None = None) -> None:
        """Hand in the sum of the sites' uploads (and any per-site statistics)."""
        task = self._pending
        if task is None:
            raise ProtocolError("the evaluation is finished; no round is open")
        if round_id != task.round_id:
            raise ProtocolError(f"aggregate for round {round_id}, but round {task.round_id} "
                                "is open")
        total = np.asarray(total, dtype=np.float64)
        if total.shape != (layout_size(task.layout),):
            raise InvalidMessage("aggregate does not match the round's layout")
        contributors = len(participants) if participants is not None else self.config.n_clients
        noise = eval_noise(self.config) if self._dp else None
        if noise is not None and contributors < noise.k_min:
            raise ProtocolError(f"{contributors} sites contributed; the DP noise is calibrated "
                                f"for at least {noise.k_min}: sum not released")
        site_stats = {}
        for k, items in (disclosed or {}).items():
            extra = set(items) - allowed_disclosures(task)
            if extra:
                raise ProtocolError(f"site {k} disclosed {sorted(extra)} that were not asked")
            try:
                check_disclosures({n: np.asarray(v) for n, v in items.items()}, task)
            except InvalidMessage as exc:
                raise InvalidMessage(f"site {k}: {exc}") from None
            if _SITE_STATS in items:
                site_stats[int(k)] = self._split_site(np.asarray(items[_SITE_STATS]))
        sums = decode_statistics(self.layout, total, self._dp)
        block_std = noise.sum_std(self.layout, contributors) if noise is not None else None
        dp_info = None
        if noise is not None:
            dp_info = {"epsilon": noise.epsilon, "delta": noise.delta, "k_min": noise.k_min,
                       "sigma_client": dict(noise.sigmas), "sum_std": block_std}
        self._result = build_result(
            self.config.job_id, self.layout, self.spec.names, self.spec.digests, sums,
            contributors, block_std=block_std, site_stats=site_stats, dp=dp_info,
            settings={"score_bins": self.layout.score_bins,
                      "calibration_bins": self.spec.calibration_bins,
                      "pva_bins": self.spec.pva_bins,
                      "log_loss_floor": self.layout.log_loss_floor,
                      "target_range": list(self.layout.target_range),
                      "profile": self.config.profile.get("name")},
            classes=self.spec.class_labels(self.layout.n_classes))
        self._pending = None

    def _split_site(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        m = self.layout.n_models
        if flat.shape != (m * self.layout.stat_size,) or not np.isfinite(flat).all():
            raise InvalidMessage("per-site statistics do not match the evaluation's layout")
        out, start = {}, 0
        for b in self.layout.blocks:
            out[b.name] = flat[start:start + m * b.size].reshape(m, *b.shape)
            start += m * b.size
        return out

    def result(self) -> EvalResult:
        if self._result is None:
            raise ProtocolError("the evaluation has not finished")
        return self._result

    def pop_events(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """DP spends recorded since the last call (no split decisions)."""
        a, b = self._events_seen
        self._events_seen = (len(self.dp_spends), len(self.decisions))
        return self.dp_spends[a:], self.decisions[b:]

    @property
    def done(self) -> bool:
        return self._result is not None
