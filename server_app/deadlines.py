"""Round deadlines: when the open phase of a job's round ends, and a cheap "not yet" check.

Each phase gets the job's full round deadline from the moment it opens
(``rounds.deadline_at``). The deadlines run on the process's own timeline
(:meth:`Deadlines.now`: the wall clock at the server's start plus the monotonic time since), so
a step of the wall clock (NTP correcting it, a date set by hand, a VM restored from a snapshot)
moves no deadline, backwards or forwards (``deadline_at`` is stored on that timeline, which
differs from the wall clock by the steps the wall clock took since the server started). After a
restart the open phase's deadline runs again from the server's start (a stored deadline that
this process did not set is on another process's timeline), so clients that were backing off
while it was down are not dropped for the server's outage. An outage of the server's database
counts the same: once a query failed because the database could not be reached (the clients got
500s and backed off), the open phase's deadline runs again from when it next answered (the
first deadline computed from a row read after the failure). So does a stall of the server
process itself (paused with SIGSTOP, a suspended or migrated VM, a swap storm): its sites'
requests waited in its socket queue, unanswered. The serving process beats every tick
(:meth:`Deadlines.beat`, from the event loop); a gap between two beats well over their interval
is such a stall, and the open phase's deadline runs again from when it is noticed: at the next
beat, or at the first deadline computed after the stall, whichever comes first. Deadlines only
move later (every phase and round sets now + the job's fixed round deadline), so the last one
seen is a lower bound for every later one of the job: until it passes, a request needs no query
to know that no deadline has passed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .db import Database, JobRow, RoundRow
from .logs import event
from .store import open_round_deadline

__all__ = ["STALL_S", "Deadlines", "steady_clock"]

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def steady_clock() -> float:
    """Seconds on a clock that no step of the wall clock moves and that counts the time the
    machine spent suspended (Linux's ``CLOCK_BOOTTIME``; elsewhere the monotonic clock, which
    may not count it): a suspended server host wakes up to a stall, and the open rounds'
    deadlines run again from then."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()

#: a gap between two heartbeats this many seconds (or one interval, if longer) beyond their
#: interval is a stall of the server process
STALL_S = 5.0


class Deadlines:
    """The deadline clock of one server process: ``clock`` is the wall clock (what the status
    tells deadlines in), ``monotonic`` what times them."""

    def __init__(self, db: Database, clock: Callable[[], float],
                 monotonic: Callable[[], float] = steady_clock) -> None:
        self._db = db
        self.clock = clock
        self._monotonic = monotonic
        self._wall0, self._mono0 = clock(), monotonic()
        #: when this server started, or its database last answered again after an outage
        self.resumed_at = self.now()
        #: when a query first failed for want of the database, until it answers again
        self.unreachable_since: float | None = None
        self._outage = threading.Lock()
        #: per job, a time before which no deadline of its open round can pass
        self._due: dict[str, float] = {}
        #: the last heartbeat and the interval of the beats (None: nothing beats)
        self._beat_at: float | None = None
        self._beat_every = 0.0
        #: the deadlines this process set and that have not passed (a stored deadline that is
        #: not among them was set before this process started, on another timeline)
        self._mine: set[float] = set()
        self._mine_mu = threading.Lock()
        db.on_unreachable(self.database_unreachable)

    def now(self) -> float:
        """This process's time, which every deadline is on: the wall clock at its start plus
        the monotonic time since (a step of the wall clock does not move it)."""
        return self._wall0 + (self._monotonic() - self._mono0)

    def database_unreachable(self, exc: BaseException) -> None:
        """A query failed because the database could not be reached (the clients meet 500s
        and back off): the deadlines stop counting against them until it answers again. The
        first failure of an outage is logged, in one line."""
        with self._outage:
            if self.unreachable_since is not None:
                return
            self.unreachable_since = self.now()
        orig = getattr(exc, "orig", None) or exc
        event("database_unavailable", logging.WARNING,
              error=f"{type(orig).__name__}: {str(orig).strip()[:200]}",
              deadlines="the open rounds' deadlines run again once it answers")

    def _database_answered(self) -> None:
        if self.unreachable_since is None:  # the usual case: no lock taken
            return
        with self._outage:
            since = self.unreachable_since
            if since is None:
                return
            self.unreachable_since = None
            self.resumed_at = max(self.resumed_at, self.now())
        event("database_available", unreachable_s=self.resumed_at - since,
              deadlines="the open rounds' deadlines run again from now")

    def beat(self, every: float) -> None:
        """The serving process's heartbeat, every ``every`` seconds: a stall since the last
        one (:meth:`_stalled`) is noticed here at the latest."""
        now = self.now()
        self._stalled(now)
        self._beat_every, self._beat_at = every, now

    def _stalled(self, now: float) -> None:
        """If the last heartbeat is overdue by more than ``max(STALL_S, interval)``, this
        process stalled (or was paused) since: the deadlines stop counting that time against
        the sites (they run again from now), and one line says so."""
        last = self._beat_at
        if last is None or now - last <= self._beat_every + max(STALL_S, self._beat_every):
            return  # the usual case: no lock taken
        with self._outage:
            if self._beat_at != last:  # another thread noticed it first
                return
            self._beat_at = now
            self.resumed_at = max(self.resumed_at, now)
        event("server_stalled", logging.WARNING, stalled_s=round(now - last, 1),
              deadlines="the open rounds' deadlines run again from now")

    def at(self, deadline_at: float, round_deadline_s: float) -> float:
        """The open phase's deadline on this process's timeline; never earlier than a full
        round deadline after this server started, its database answered again after an
        outage, or its process ran again after a stall; a full round deadline after the
        latest of those when ``deadline_at`` was set before this process started (every
        caller read ``deadline_at`` from the database just now: it answers)."""
        self._stalled(self.now())
        self._database_answered()
        rearmed = self.resumed_at + round_deadline_s
        if deadline_at in self._mine:
            return max(deadline_at, rearmed)
        # set by an earlier process, before its phase's full deadline from this start (on one
        # clock), or on a timeline that a step of the wall clock moved, either way
        return rearmed

    def of(self, rr: RoundRow, job: JobRow) -> float:
        """The open phase's deadline on the wall clock (what the status tells)."""
        return self.clock() + (self.at(rr.deadline_at, job.round_deadline_s) - self.now())

    def remaining(self, rr: RoundRow, job: JobRow) -> float:
        """Seconds left in the open phase (what clients are told)."""
        return self.remaining_at(rr.deadline_at, job.round_deadline_s)

    def remaining_at(self, deadline_at: float, round_deadline_s: float) -> float:
        """:meth:`remaining` from the stored values."""
        return max(0.0, self.at(deadline_at, round_deadline_s) - self.now())

    def passed(self, rr: RoundRow, job: JobRow) -> bool:
        return self.now() >= self.at(rr.deadline_at, job.round_deadline_s)

    def opened(self, job_id: str, round_deadline_s: float) -> float:
        """A phase of ``job_id`` opens now: its deadline, ``round_deadline_s`` from now on this
        process's timeline (noted as the job's lower bound), for ``rounds.deadline_at``."""
        now = self.now()
        at = now + round_deadline_s
        with self._mine_mu:
            # one that passed needs no record: taken for an earlier process's, it is re-armed
            # to resumed_at + round deadline, which has passed too or is what it gave anyway
            self._mine = {d for d in self._mine if d >= now}
            self._mine.add(at)
        self._due[job_id] = at
        return at

    def forget(self, job_id: str) -> None:
        """Drop the job's lower bound (its round changed under a rollback, or it stopped)."""
        self._due.pop(job_id, None)

    def watched(self) -> list[str]:
        """The jobs with a known lower bound (running jobs this process has seen)."""
        return list(self._due)

    def due(self, job_id: str) -> bool:
        """Whether the open round's deadline has passed: no query while the lower bound has
        not passed, one small query otherwise."""
        lower = self._due.get(job_id)
        if lower is not None and self.now() < lower:
            return False
        with self._db.session() as sess:
            found = open_round_deadline(sess, job_id)
        if found is None:
            self._due.pop(job_id, None)
            return False
        round_deadline_s, deadline_at = found
        at = self.at(deadline_at, round_deadline_s)
        if self.now() >= at:
            self._due.pop(job_id, None)
            return True
        self._due[job_id] = at
        return False
