"""Replay a job's audit log through the coordinator: tasks and model follow from the sums.

The coordinator is deterministic: given the job's configuration, every task it issues is a
function of the aggregates (and disclosed items) of the rounds before. A server therefore logs
each round's task as its digest only (``task_digest``: SHA-256 of the task's exact bytes, the
bytes every client hashed before answering and the digest its masks are bound to), and the
aggregate in full. :func:`replay_job` rebuilds the coordinator from the configuration in the
``job_created`` entry, asks it for each round's task, checks the digest against the logged one,
feeds it the logged aggregate, and at the end checks the digest of the model it yields against
the ``model`` entry; the logged ``split`` decisions must be the ones the coordinator takes. A
log whose aggregates were altered (even with the chain rewritten to match) stops replaying at
the first task that no longer follows, where the change moves a decision (receipts catch any
change); a logged task digest that is not the task the rules produce (a server that asked
something else) is named. An evaluation result logged by a server from before results named
their classes (the same document without ``classes``) is taken as well.

This needs the training engine (:mod:`fedforest_secure.coordinator`) and costs about the
coordinator's share of a training run; ``fedforest audit verify --replay`` runs it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import defaultdict
from typing import Any

import numpy as np

from ..errors import AuditError, FedForestError
from .entry import Entry, canonical_json, jsonable
from .kinds import EntryKind
from .log import AuditLog

__all__ = ["replay_job"]


def replay_job(log: AuditLog, job_id: str) -> list[str]:
    """Problems found replaying ``job_id`` (empty: every task and the model follow).

    Entries are assumed chained and intact (check with :func:`~.verify.verify_log` first); a
    stored array that does not match its digest is reported, not trusted.
    """
    from ..config import JobConfig

    entries = log.entries(job_id=job_id)
    where = f"job {job_id!r} replay"
    created = next((e for e in entries if e.kind == EntryKind.JOB_CREATED.value), None)
    if created is None:
        return [f"{where}: no job_created entry"]
    payload = created.payload
    if not isinstance(payload.get("config"), dict) or not isinstance(payload.get("clients"),
                                                                        list):
        return [f"{where}: {created.label} does not record the job's configuration and "
                "client list: cannot replay"]
    try:
        config = JobConfig.from_json(canonical_json(payload["config"]))
        coord = _coordinator(config)
    except (FedForestError, ValueError, TypeError, KeyError) as exc:
        return [f"{where}: {created.label}: the configuration does not load ({exc})"]
    index = {str(name): k for k, name in enumerate(payload["clients"])}
    disclosed = _disclosures(log, entries, index)
    problems: list[str] = []
    logged_splits: dict[int | None, list[str]] = defaultdict(list)
    for entry in entries:
        if entry.kind == EntryKind.SPLIT.value:
            logged_splits[entry.round_id].append(entry.payload_json)
    for entry in entries:
        if entry.kind != EntryKind.ROUND.value:
            continue
        found = _replay_round(log, coord, entry, index, disclosed)
        if found is not None:
            return [*problems, f"{where}: {found}"]
        # the split decisions the coordinator takes on these sums are the ones logged
        _, decisions = coord.pop_events()
        replayed = [canonical_json(jsonable({"splits": d["splits"], "level": d["level"],
                                             "round_id": entry.round_id}))
                    for d in decisions]
        if replayed != logged_splits.get(entry.round_id, []):
            problems.append(f"{where}: {entry.label}: the logged split decisions are not the "
                            "ones the coordinator takes on the logged sums")
    model = next((e for e in entries if e.kind == EntryKind.MODEL.value), None)
    if model is not None:
        schema = payload.get("schema")
        problems.extend(f"{where}: {p}" for p in _check_model(
            coord, model, schema if isinstance(schema, str) else None,
            [str(c) for c in payload["clients"]]))
    return problems


def _coordinator(config: Any) -> Any:
    """The job's coordinator: an evaluation's, or the training engine's."""
    if config.evaluation is not None:
        from ..evaluation.coordinator import EvalCoordinator

        return EvalCoordinator(config)
    from ..coordinator import Coordinator

    return Coordinator(config)


def _disclosures(log: AuditLog, entries: list[Entry], index: dict[str, int]
                 ) -> dict[int, dict[int, dict[str, np.ndarray]]]:
    """``{round: {client index: {item: array}}}`` from the ``disclosure`` entries."""
    out: dict[int, dict[int, dict[str, np.ndarray]]] = defaultdict(lambda: defaultdict(dict))
    for entry in entries:
        if entry.kind != EntryKind.DISCLOSURE.value or entry.round_id is None:
            continue
        p = entry.payload
        k = index.get(str(p.get("client")))
        if k is not None:
            out[entry.round_id][k][str(p.get("item"))] = log.array(entry, "data")
    return out


def _replay_round(log: AuditLog, coord: Any, entry: Entry, index: dict[str, int],
                  disclosed: dict[int, dict[int, dict[str, np.ndarray]]]) -> str | None:
    """Feed one round to the coordinator; a problem stops the replay (returned)."""
    p = entry.payload
    round_id = entry.round_id
    task = coord.next_task()
    if task is None:
        return f"{entry.label}: the coordinator had finished; the logged aggregates lead to " \
               "no further round"
    if task.round_id != round_id or task.digest().hex() != p.get("task_digest"):
        return (f"{entry.label}: round {round_id}'s task does not follow from the logged "
                f"configuration and the aggregates before it (replayed round {task.round_id}, "
                f"digest {task.digest().hex()[:16]}..., logged {str(p.get('task_digest'))[:16]}"
                "...)")
    try:
        aggregate = np.asarray(log.array(entry, "aggregate"), dtype=np.float64)
    except AuditError as exc:
        return str(exc)
    clients = [str(c) for c in p.get("clients", [])]
    unknown = sorted(set(clients) - set(index))
    if unknown:
        return f"{entry.label}: clients {unknown} are not members of the job"
    participants = [index[c] for c in clients]
    items = disclosed.get(task.round_id, {})
    try:
        coord.submit(task.round_id, aggregate, disclosed={k: dict(items.get(k, {}))
                                                          for k in participants},
                     participants=participants)
    except (FedForestError, ValueError, ArithmeticError) as exc:
        return f"{entry.label}: the coordinator rejects the logged aggregate ({exc})"
    return None


def _check_model(coord: Any, model: Entry, schema: str | None, clients: list[str]
                 ) -> list[str]:
    if coord.next_task() is not None:
        return [f"{model.label}: the log ends training early: the coordinator still has rounds "
                "to ask"]
    # the file the server stored: the forest with the job's schema and site names, or an
    # evaluation job's result as it is
    from ..model import ForestModel

    result = coord.result()
    text = (result.for_job(schema, clients) if isinstance(result, ForestModel)
            else result).to_json()
    digest = hashlib.sha256(text.encode()).hexdigest()
    logged = model.payload.get("digest")
    older = getattr(coord, "unreconciled", None)  # a job that lost a site, as stored before
    if older is not None:  # its split nodes took their children's totals
        older = hashlib.sha256(older.for_job(schema, clients).to_json().encode()).hexdigest()
    if digest != logged and older != logged and not _older_result(result, logged):
        return [f"{model.label}: the model the logged aggregates yield has digest "
                f"{digest[:16]}..., the log says {str(logged)[:16]}..."]
    return []


def _older_result(result: Any, logged: Any) -> bool:
    """Whether ``logged`` is the digest of the evaluation result as a server stored it before
    results named their classes: the same document without its ``classes`` list."""
    from ..evaluation.result import EvalResult

    if not isinstance(result, EvalResult) or result.classes is None:
        return False
    text = dataclasses.replace(result, classes=None).to_json()
    return bool(hashlib.sha256(text.encode()).hexdigest() == logged)
