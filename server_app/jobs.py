"""The in-memory state of one running job, beside what the database holds of it."""

from __future__ import annotations

from dataclasses import dataclass

from fedforest_secure.config import JobConfig
from fedforest_secure.privacy.profile import with_profile_defaults
from fedforest_secure.protocol import SealedTask, layout_size
from fedforest_secure.secure_sum import StatCodec

from .engine import PlainBounds, RoundEngine, plain_bounds, round_codec, uses_secagg
from .phases import RoundPlan, plan_for
from .secagg_bridge import SecAggBridge

__all__ = ["JobRuntime", "new_runtime"]


@dataclass
class JobRuntime:
    """A job's coordinator, its open round's task, and (secure jobs) its secagg relay.

    Rebuilt from the database whenever it is missing (:mod:`server_app.replay`), so it holds
    nothing the database cannot give back.
    """

    job_id: str
    config: JobConfig
    names: dict[int, str]
    min_clients: int
    deadline_s: float
    #: the relay of a job with secure aggregation; None for plain jobs
    secure: SecAggBridge | None = None
    #: None once the job stopped (done, failed, or not resumable)
    coord: RoundEngine | None = None
    #: the open round's task, sealed: packed and hashed once, the same bytes for every client
    task: SealedTask | None = None
    #: the open round's fixed-point codec (None for float64 rounds)
    codec: StatCodec | None = None
    _bounds: tuple[int, PlainBounds] | None = None

    @property
    def plan(self) -> RoundPlan:
        """The phases of this job's rounds."""
        return plan_for(self.secure is not None)

    def coordinator(self) -> RoundEngine:
        if self.coord is None:
            raise RuntimeError(f"job {self.job_id!r} has no coordinator: it is not running")
        return self.coord

    def open_task(self, task: SealedTask) -> None:
        """Hold ``task`` as the open round's task, with its codec."""
        self.task = task
        self.codec = round_codec(self.config, task)

    def release(self) -> None:
        """The job stopped (done or failed): let its coordinator, its open round's task, codec
        and bounds, its open secure round, its key directory and the key adverts for a next
        round go, so that a server running for weeks holds none of a finished job's (and
        :meth:`Runtimes.drop_stopped <server_app.replay.Runtimes.drop_stopped>` forgets the
        runtime itself). A member asking for that round's task then gets its stored bytes
        (410 once pruned), as for every other round."""
        self.coord = None
        self.task = None
        self.codec = None
        self._bounds = None
        if self.secure is not None:
            self.secure.current = None
            self.secure.directory = {}
            self.secure.pending = {}

    @property
    def stopped(self) -> bool:
        """Whether the job stopped (done or failed): its runtime has no coordinator."""
        return self.coord is None

    def words(self) -> int:
        """Words of the open round's uploads: its codec's (packed grid cells one word each),
        or one per entry of the layout (float64 rounds)."""
        if self.task is None:
            raise RuntimeError("no open round")
        return self.codec.words if self.codec is not None else layout_size(self.task.layout)

    def bounds(self) -> PlainBounds:
        """The open round's plaintext bounds (computed once per round)."""
        task = self.task
        if task is None:
            raise RuntimeError("no open round")
        if self._bounds is None or self._bounds[0] != task.round_id:
            self._bounds = (task.round_id, plain_bounds(self.config, task))
        return self._bounds[1]


def new_runtime(job_id: str, config: JobConfig, names: dict[int, str], min_clients: int,
                deadline_s: float) -> JobRuntime:
    """A runtime without coordinator or open round; secure jobs get their relay."""
    rt = JobRuntime(job_id, config, names, min_clients, deadline_s)
    if uses_secagg(config):
        # a setting the stored profile leaves out is PrivacyProfile's default, as the sites
        # read it (threshold 1.0): a round setup announcing another t would be refused
        prof = with_profile_defaults(config.profile)
        thr = prof["threshold"]
        threshold = int(thr) if isinstance(thr, int) and not isinstance(thr, bool) \
            else float(thr)
        rt.secure = SecAggBridge(job_id, threshold, neighbours=prof["neighbours"])
    return rt
