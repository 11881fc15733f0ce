"""Where a job stands, as members (``GET /v1/jobs/{job}``) and the operator page see it.

The fields are :class:`fedforest_secure.protocol.api.JobStatus`'s. Members see each other's
names and states, as the job's audit log (which every member can fetch) records them in
``client_joined`` and ``client_dropped``. Why a site declined the job (its code: ``table``
may say that a value of its table lies outside the schema's bounds) is shown to the operator
and to that site only, and so is nothing else the operator did to a site (an invited member
whose client it revoked is ``revoked`` in its view only); nothing here is about any site's
data.

The ETA is a plain extrapolation: the time the levels so far took, per level, times the levels
left (later levels have more nodes, so it errs on the short side). A level that overruns that
time (a site stalls) has no ETA (``eta_s`` None) but ``overrun_s``, how long it has run beyond
it; ``deadline_in_s`` is the time left until the open phase's deadline, when the sites that have
not answered it are dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .db import JobRow, MemberRow, RoundRow
from .phases import JobStatus, MemberState, RoundStatus
from .store import client_names, closed_rounds, declines_of, members_of, revoked_members

__all__ = ["job_status", "progress"]


#: when the open phase of a round ends at the latest (the server's :meth:`Deadlines.of
#: <server_app.deadlines.Deadlines.of>`, which a restart moves later)
DeadlineOf = Callable[[RoundRow, JobRow], float]


def _stored_deadline(rr: RoundRow, job: JobRow) -> float:
    return rr.deadline_at


def progress(sess: Session, job: JobRow, now: float, *,
             deadline: DeadlineOf | None = None) -> dict[str, Any]:
    """``kind``, ``level``, ``max_depth``, ``phase``, ``rounds_done``, ``eta_s``,
    ``overrun_s`` and ``deadline_in_s`` of a job; ``deadline`` gives the open phase's deadline
    (default: the stored one, which a server restarted since may have moved later)."""
    config = json.loads(job.config_json)
    trees = config.get("evaluation") is None  # an evaluation job has one round, no levels
    max_depth = int(config.get("max_depth", 0))
    out: dict[str, Any] = {"kind": "train" if trees else "evaluate",
                           "max_depth": max_depth if trees else None, "level": None,
                           "phase": None, "rounds_done": 0, "eta_s": None,
                           "overrun_s": None, "deadline_in_s": None,
                           "profile": (config.get("profile") or {}).get("name")}
    rr = sess.get(RoundRow, (job.id, job.current_round)) if job.current_round >= 0 else None
    if rr is None:
        if job.status == JobStatus.DONE:  # pruned: a done job closed rounds 1..current_round
            out["rounds_done"] = max(job.current_round, 0)
        return out
    out["level"] = rr.level if trees else None
    if rr.status == RoundStatus.OPEN and job.status == JobStatus.RUNNING:
        out["phase"] = rr.phase  # a failed job's aborted round is in no phase
        at = (deadline or _stored_deadline)(rr, job)
        out["deadline_in_s"] = max(0.0, at - now)
    out["rounds_done"] = closed_rounds(sess, job.id)
    if trees and job.status == JobStatus.RUNNING and 0 < rr.level <= max_depth:  # 0: unknown
        first = sess.scalar(select(func.min(RoundRow.issued_at)).where(
            RoundRow.job_id == job.id))
        level_start = sess.scalar(select(func.min(RoundRow.issued_at)).where(
            RoundRow.job_id == job.id, RoundRow.level == rr.level))
        if first is not None and level_start is not None and level_start > first:
            per_level = (level_start - first) / rr.level
            overrun = (now - level_start) - per_level
            if overrun > 0:  # a site stalls the level: no estimate until it moves on
                out["overrun_s"] = overrun
            else:
                out["eta_s"] = per_level * (max_depth - rr.level) - overrun
    return out


def job_status(sess: Session, job: JobRow, member: MemberRow | None, now: float, *,
               deadline: DeadlineOf | None = None) -> dict[str, Any]:
    """The job's status; ``member`` is the asking site (None: the operator); ``deadline`` as
    :func:`progress`'s."""
    members = members_of(sess, job.id)
    names = client_names(sess, job.id)
    declined = declines_of(sess, job.id) if any(
        m.state == MemberState.INVITED for m in members) else {}
    if member is not None:  # a site sees its own reason only; the operator every site's
        declined = {i: r for i, r in declined.items() if i == member.client_index}
    listed = [{"name": names.get(m.client_index, f"client-{m.client_index}"),
               "index": m.client_index, "state": m.state,
               "dropped_round": m.dropped_round,
               "declined": declined.get(m.client_index)}
              for m in sorted(members, key=lambda m: m.client_index)]
    if member is None:  # the operator's view: a site revoked while the job waits for it
        revoked = revoked_members(sess, job.id)
        for m in listed:
            m["revoked"] = m["state"] == MemberState.INVITED and m["index"] in revoked
    return {
        "job_id": job.id, "status": job.status, "reason": job.reason,
        "round_id": job.current_round,
        "client_index": None if member is None else member.client_index,
        "member_state": None if member is None else member.state,
        "min_clients": job.min_clients, "n_clients": len(members),
        "active_clients": sum(m.state == MemberState.ACTIVE for m in members),
        "joined_clients": sum(m.state != MemberState.INVITED for m in members),
        "dropped_clients": sum(m.state == MemberState.DROPPED for m in members),
        "members": listed, "model_digest": job.model_digest,
        **progress(sess, job, now, deadline=deadline),
    }
