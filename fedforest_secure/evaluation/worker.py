"""The site side of an evaluation job: score the job's models on the site's held-out rows.

:class:`EvalWorker` answers the job's one ``evaluate`` task with a :class:`~..protocol.Reply`
whose summable vector is the site's statistics (:mod:`.stats`) as integers (:mod:`.encoding`),
plus, under a DP profile, its own discrete-Gaussian noise (:mod:`.noise`, computed from its own
configuration, never from the task). Like the training worker it refuses what its profile does
not allow, whatever the task says:

* a layout other than the one its configuration defines (no other statistic can be asked);
* per-site statistics in the clear unless its profile has no secure aggregation (the server
  sees every upload anyway) or sets ``site_metrics = true`` (never with DP);
* a second question in the same job (an evaluation asks one, so a server cannot re-ask it
  over fewer sites and subtract).

A site with fewer held-out rows than the profile's ``abstain_below`` contributes zeros (still
masked, and still with its noise share).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ProtocolError, RefusedRequest
from ..privacy.profile import with_profile_defaults
from ..protocol import TASK_ARRAYS, TASK_PARAMS, Reply, Task, TaskKind
from .encoding import encode_statistics
from .noise import config_layout, eval_noise
from .spec import MAX_EVAL_ROWS, EvalSpec, EvaluationError
from .stats import site_statistics

if TYPE_CHECKING:
    from ..config import JobConfig

__all__ = ["EvalWorker", "SITE_STATS"]

#: The disclosure item of per-site statistics (the site's raw sums, float64, block order).
SITE_STATS = "site_stats"


class EvalWorker:
    """One site's side of an evaluation job.

    Parameters
    ----------
    config : JobConfig
        The evaluation job's configuration (with ``evaluation``).
    X : ndarray of shape (n, n_features)
        The site's held-out rows.
    y : ndarray of shape (n,)
        Their targets (class codes for classification).
    """

    def __init__(self, config: JobConfig, X: np.ndarray, y: np.ndarray) -> None:
        self.config = config
        self.spec = EvalSpec.of(config)
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y)
        if X.ndim != 2 or X.shape[1] != config.n_features or y.shape != (X.shape[0],):
            raise EvaluationError(f"held-out rows must be (n, {config.n_features}) with one "
                                  "target per row")
        if X.shape[0] > MAX_EVAL_ROWS:
            raise EvaluationError(f"a site scores at most {MAX_EVAL_ROWS} held-out rows")
        self.spec.check_models(config.task, config.n_features, config.n_classes)
        self._X, self._y = X, y
        self._dp = config.dp is not None
        self.layout = config_layout(config)
        # every setting the profile leaves out at PrivacyProfile's default
        self._profile: dict[str, Any] = with_profile_defaults(config.profile)
        self._answered: tuple[int, bytes, Reply] | None = None
        self._stats: dict[str, np.ndarray] | None = None

    @property
    def n_rows(self) -> int:
        return int(self._X.shape[0])

    @property
    def abstains(self) -> bool:
        """Whether this site sends zeros: fewer held-out rows than ``abstain_below``."""
        return self.n_rows < int(self._profile.get("abstain_below", 0) or 0)

    def allowed_disclosures(self) -> set[str]:
        """Per-site statistics, if this site's own profile allows them."""
        prof = self._profile
        if prof.get("dp"):
            return set()
        if not prof.get("secure_aggregation") or prof.get("site_metrics"):
            return {SITE_STATS}
        return set()

    def statistics(self) -> dict[str, np.ndarray]:
        """This site's raw statistics (every block with its model axis; computed once)."""
        if self._stats is None:
            self._stats = site_statistics(self.layout, self.spec.forests(), self._X, self._y)
        return dict(self._stats)

    def handle(self, task: Task) -> Reply:
        """Answer the evaluation task (the same reply again for a retried round)."""
        if task.job_id != self.config.job_id:
            raise ProtocolError("task belongs to another job")
        digest = task.digest()
        if self._answered is not None:
            round_id, seen, reply = self._answered
            if task.round_id == round_id and digest == seen:
                return reply
            raise RefusedRequest("this evaluation was already answered; an evaluation job asks "
                                 "one question (a second could isolate a site by differencing)")
        if task.kind != TaskKind.EVALUATE:
            raise ProtocolError(f"an evaluation job does not answer {task.kind.value} tasks")
        extra = (set(task.params) - TASK_PARAMS[task.kind]) | (
            set(task.arrays) - TASK_ARRAYS[task.kind])
        if extra:
            raise ProtocolError(f"task carries fields this client does not use: {sorted(extra)}")
        if task.layout != self.layout.wire(self._dp):
            raise ProtocolError("the task asks for statistics this evaluation does not define")
        undisclosable = set(task.disclose) - self.allowed_disclosures()
        if undisclosable:
            raise RefusedRequest(f"the privacy profile {self._profile.get('name', '?')!r} "
                                 f"forbids disclosing {sorted(undisclosable)}", code="disclosure")
        reply = self._answer(task)
        self._answered = (task.round_id, digest, reply)
        return reply

    def _answer(self, task: Task) -> Reply:
        if self.abstains:
            stats = {b.name: np.zeros((self.layout.n_models, *b.shape))
                     for b in self.layout.blocks}
            rows = 0
        else:
            stats = self.statistics()
            rows = self.n_rows
        vec = encode_statistics(self.layout, stats, rows, self._dp)
        if self._dp:
            vec = vec + eval_noise(self.config).sample(self.layout)
        disclosed = {}
        if SITE_STATS in task.disclose:
            disclosed[SITE_STATS] = np.concatenate(
                [np.asarray(stats[b.name], dtype=np.float64).reshape(-1)
                 for b in self.layout.blocks])
        return Reply(round_id=task.round_id, summable=vec, disclosed=disclosed)
