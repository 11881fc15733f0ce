"""A site's answer to its invitation to a job: joining (with its identity key, registered,
audited and relayed, in a secure job), declining, the job's offer it checks before it joins,
and the job's start once no site is left invited.

These are the steps of :class:`~server_app.runtime.ServerState` of the same names, on the
server's parts (:class:`~server_app.core.Core`); a step that writes runs under its lock.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

from fedforest_secure import __version__
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError

from .core import Core
from .db import ClientRow, JobRow
from .engine import uses_secagg
from .errors import ApiError
from .jobs import JobRuntime
from .jobspec import schema_sha256, stored_schema_text
from .logs import event
from .phases import JobStatus, MemberState
from .store import (
    DECLINED,
    IDENTITY,
    IDENTITY_CERT,
    add_message,
    identity_keys,
    job_of,
    member_indices,
    membership,
    stored_message,
)

__all__ = ["decline", "job_offer", "join"]


def join(core: Core, client: ClientRow, job_id: str, identity_key: bytes | None = None,
         identity_cert: str | None = None) -> dict[str, Any]:
    """Join a job. Secure jobs need the client's long-term Ed25519 verify key (32 bytes),
    registered once, audited, and relayed to the other clients in the directory, with its
    certification (``{"cert": PEM, "sig": hex}`` JSON) when the client sends one. Under every
    profile the key a site first joins with is kept, and a later join of the running job
    with another key is refused (``identity_mismatch``): another client of the site."""
    with core.lock:
        with core.db.session() as sess:
            job, member = membership(sess, client, job_id)
            if member.state == MemberState.DROPPED:
                raise ApiError(403, "dropped",
                               f"this client was dropped at round {member.dropped_round}")
            secure = uses_secagg(JobConfig.from_json(job.config_json))
            idx = member.client_index
            stored = stored_message(sess, job_id, -1, IDENTITY, idx)
            if secure and (identity_key is None or len(identity_key) != 32):
                raise ApiError(400, "identity_required", "this job uses secure "
                               "aggregation: join with your Ed25519 identity key "
                               "(32 bytes, hex) as {\"identity_key\": ...}")
            # under every profile: a second client of the site (another state directory)
            # would answer the rounds in its place, with other rows under the open profile;
            # a finished job has no round left to answer (its model is there to download)
            finished = job.status in (JobStatus.DONE, JobStatus.FAILED)
            if identity_key is not None and stored is not None \
                    and stored.body != identity_key.hex() and not finished:
                raise ApiError(409, "identity_mismatch", "this client joined with "
                               "another identity key; it cannot change mid-job")
            first = member.state == MemberState.INVITED
            if first:
                declined = stored_message(sess, job_id, -1, DECLINED, idx)
                if declined is not None:  # the site fixed what made it decline
                    sess.delete(declined)
                core.changes.touch(job_id)
                if job.status == JobStatus.FAILED:  # e.g. cancelled before it started
                    raise ApiError(409, "job_failed", job.reason or "the job failed")
                if job.status != JobStatus.WAITING:
                    raise ApiError(409, "job_started", "the job started without this client")
                member.state = MemberState.ACTIVE
                member.joined_at = core.clock()
                if identity_key is not None and stored is None:
                    if secure and identity_key.hex() in identity_keys(sess, job_id).values():
                        # every site would refuse the directory (one key, two entries)
                        raise ApiError(409, "identity_taken", "another site of this job "
                                       "joined with this identity key: each site makes its "
                                       "own (a state directory copied from another site?); "
                                       f"delete identity-{job_id}.ed25519 and "
                                       f"table-{job_id}.sha256 from this site's --state-dir "
                                       "and start the client again, which makes a new key")
                    add_message(sess, job_id, -1, IDENTITY, idx, identity_key.hex(),
                                digest=hashlib.sha256(identity_key).hexdigest())
                    if secure and identity_cert is not None:
                        add_message(sess, job_id, -1, IDENTITY_CERT, idx, identity_cert,
                                    digest=hashlib.sha256(identity_cert.encode()
                                                          ).hexdigest())
            info = _job_info(job, client, idx, secure)
            if first:
                # committed with the join and appended to the log once it committed (a join
                # the database rolled back leaves no entry; a retry of a join that committed
                # is not logged again)
                payload: dict[str, Any] = {"client": client.name, "client_index": idx}
                if secure and identity_key is not None:
                    payload["identity_key"] = identity_key.hex()
                    if identity_cert is not None:
                        payload["identity_cert"] = json.loads(identity_cert)
                core.audit.within(sess).append(job_id, "client_joined", payload)
        if first:
            event("join", job=job_id, client=client.name, index=idx)
        _maybe_start(core, job_id)
        core.changes.notify(job_id)
        return info


def decline(core: Core, client: ClientRow, job_id: str, reason: str) -> dict[str, Any]:
    """An invited site will not join the job, for ``reason`` (a code): kept beside the
    member (the job status shows it) until the site joins."""
    with core.lock:
        with core.db.session() as sess:
            _, member = membership(sess, client, job_id)
            if member.state != MemberState.INVITED:
                raise ApiError(409, "not_invited", f"this client is {member.state} in job "
                               f"{job_id}: only a site that has not joined declines it")
            idx = member.client_index
            old = stored_message(sess, job_id, -1, DECLINED, idx)
            if old is not None:
                sess.delete(old)
                sess.flush()
            add_message(sess, job_id, -1, DECLINED, idx, reason)
        event("declined", logging.WARNING, job=job_id, client=client.name, reason=reason)
        core.changes.notify(job_id)
    return {"status": "declined", "reason": reason}


def job_offer(core: Core, client: ClientRow, job_id: str) -> dict[str, Any]:
    """What the join answers (the job's configuration, schema digest and this client's
    place), without joining: a site checks the job against its own pins first, so a site
    that refuses the job is never counted as joined."""
    with core.db.session() as sess:
        job, member = membership(sess, client, job_id)
        if member.state == MemberState.DROPPED:
            raise ApiError(403, "dropped",
                           f"this client was dropped at round {member.dropped_round}")
        return _job_info(job, client, member.client_index,
                         uses_secagg(JobConfig.from_json(job.config_json)))


def _maybe_start(core: Core, job_id: str) -> None:
    """Start the waiting job ``job_id`` once no site is left invited: issue its first round,
    or fail it with the reason it cannot start."""
    with core.db.session() as sess:
        job = sess.get(JobRow, job_id)
        if job is None or job.status != JobStatus.WAITING:
            return
        if member_indices(sess, job_id, MemberState.INVITED):
            return
    try:
        rt = core.runtimes.get(job_id)
    except (FedForestError, ValueError) as exc:
        # a job created before create-job checked it: stop it with the reason, which the
        # sites read in the job status, instead of failing every request
        with core.db.session() as sess:
            core.driver.fail(sess, job_of(sess, job_id),
                             f"the job cannot start: {exc}", None, None)
        return
    try:
        _start(core, job_id, rt)
    except (FedForestError, ValueError) as exc:
        # its first round cannot be issued (e.g. its codec refuses the job's settings): the
        # start rolled back, and the job fails with the reason rather than a 500 to the join
        # that started it, which would leave the job waiting for ever
        with core.db.session() as sess:
            core.driver.fail(sess, job_of(sess, job_id), f"the job cannot start: {exc}", None,
                             rt)


def _start(core: Core, job_id: str, rt: JobRuntime) -> None:
    """Mark the job running and issue its first round (one transaction)."""
    with core.runtimes.guard(job_id), core.db.session() as sess:
        job = job_of(sess, job_id)
        job.status = JobStatus.RUNNING
        ev, profile = rt.config.evaluation, rt.config.profile.get("name")
        if ev is not None:
            event("job_started", job=job_id, clients=rt.config.n_clients, profile=profile,
                  kind="evaluate", models=len(ev.get("names", ())),
                  server_cpu_s=time.process_time())
        else:
            event("job_started", job=job_id, clients=rt.config.n_clients, profile=profile,
                  trees=rt.config.n_estimators, max_depth=rt.config.max_depth,
                  server_cpu_s=time.process_time())
        core.driver.issue_next(rt, sess, job)


def _job_info(job: JobRow, client: ClientRow, idx: int, secure: bool) -> dict[str, Any]:
    """The join response: the job's configuration and this client's place in it."""
    schema = stored_schema_text(job.spec_json)
    return {"job_id": job.id, "client_index": idx, "client_name": client.name,
            "config": json.loads(job.config_json), "status": job.status,
            "schema_sha256": schema_sha256(schema), "min_clients": job.min_clients,
            "round_deadline": job.round_deadline_s, "secure_aggregation": secure,
            "server_version": __version__}
