"""The kinds of audit entries and the payload keys each one must carry.

==================  =========================================================================
kind                payload (required keys first; more keys are allowed and hashed alike)
==================  =========================================================================
``job_created``     ``schema``, ``hyperparameters``, ``profile`` (a server also logs ``clients``
                    in index order and ``config``, the job's JobConfig: what a replay needs)
``client_joined``   ``client``
``client_dropped``  ``client`` (``round_id``, ``reason``; ``accused``: the site a client that
                    refused a secure round accused of a message that did not authenticate)
``abstained``       ``count`` (``round_id``, ``node``): how many clients contributed nothing
``round``           ``round_id``, ``clients``, ``uploads`` ({client: upload sha256}),
                    ``masked`` (true when uploads were masked); ``task_kind``, ``level``,
                    ``layout``, ``task_digest``, ``params``; array ``aggregate`` = the unmasked
                    sum the server obtained. The task's arrays are either stored as arrays
                    ``task/<name>`` (:meth:`JobRecorder.round`) or, as the server does, only
                    described (``task_arrays``: name -> dtype and shape) and bound by
                    ``task_digest``: the task follows from the configuration and the earlier
                    aggregates, which ``fedforest audit verify --replay`` checks
``round_aborted``   ``round_id``, ``reason``: no sum was released
``job_failed``      ``reason``: the job stopped between rounds (too few sites remained, or it
                    could not start or resume); no model came out of it
``disclosure``      ``client``, ``item`` (``round_id``); array ``data`` = the plaintext disclosed
``dp_spend``        ``epsilon``, ``delta``, ``mechanism``, ``total_epsilon``, ``total_delta``
``split``           ``splits`` (a list of split decisions; ``round_id``)
``model``           ``digest`` (SHA-256 of the final model file; an evaluation job's: of its
                    result document)
==================  =========================================================================
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

__all__ = ["EntryKind", "check_payload"]


class EntryKind(enum.StrEnum):
    """What an audit entry records."""

    JOB_CREATED = "job_created"
    CLIENT_JOINED = "client_joined"
    CLIENT_DROPPED = "client_dropped"
    ABSTAINED = "abstained"
    ROUND = "round"
    ROUND_ABORTED = "round_aborted"
    JOB_FAILED = "job_failed"
    DISCLOSURE = "disclosure"
    DP_SPEND = "dp_spend"
    SPLIT = "split"
    MODEL = "model"


_REQUIRED: dict[EntryKind, tuple[frozenset[str], frozenset[str]]] = {
    # kind: (payload keys, array names)
    EntryKind.JOB_CREATED: (frozenset({"schema", "hyperparameters", "profile"}), frozenset()),
    EntryKind.CLIENT_JOINED: (frozenset({"client"}), frozenset()),
    EntryKind.CLIENT_DROPPED: (frozenset({"client"}), frozenset()),
    EntryKind.ABSTAINED: (frozenset({"count"}), frozenset()),
    EntryKind.ROUND: (frozenset({"round_id", "clients", "uploads", "masked"}),
                      frozenset({"aggregate"})),
    EntryKind.ROUND_ABORTED: (frozenset({"round_id", "reason"}), frozenset()),
    EntryKind.JOB_FAILED: (frozenset({"reason"}), frozenset()),
    EntryKind.DISCLOSURE: (frozenset({"client", "item"}), frozenset({"data"})),
    EntryKind.DP_SPEND: (frozenset({"epsilon", "delta", "mechanism", "total_epsilon",
                                    "total_delta"}), frozenset()),
    EntryKind.SPLIT: (frozenset({"splits"}), frozenset()),
    EntryKind.MODEL: (frozenset({"digest"}), frozenset()),
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_payload(kind: EntryKind, payload: Mapping[str, Any], array_names: set[str]) -> None:
    """Raise ``ValueError`` naming what is missing or mistyped in an entry of ``kind``."""
    keys, arrays = _REQUIRED[kind]
    missing = sorted(keys - set(payload))
    if missing:
        raise ValueError(f"{kind.value} payload lacks {', '.join(missing)}")
    missing = sorted(arrays - array_names)
    if missing:
        raise ValueError(f"{kind.value} entry lacks array {', '.join(missing)}")
    if "round_id" in payload and payload["round_id"] is not None \
            and not _is_int(payload["round_id"]):
        raise ValueError(f"{kind.value} payload: round_id must be an integer")
    if kind is EntryKind.ROUND:
        clients, uploads = payload["clients"], payload["uploads"]
        if not isinstance(clients, list | tuple) or not all(isinstance(c, str) for c in clients):
            raise ValueError("round payload: clients must be a list of client ids")
        if not isinstance(uploads, Mapping) or set(uploads) != set(clients):
            raise ValueError("round payload: uploads must map every listed client to a digest")
        if not isinstance(payload["masked"], bool):
            raise ValueError("round payload: masked must be true or false")
    if kind is EntryKind.ABSTAINED and (not _is_int(payload["count"]) or payload["count"] < 0):
        raise ValueError("abstained payload: count must be a non-negative integer")
    if kind in (EntryKind.CLIENT_JOINED, EntryKind.CLIENT_DROPPED, EntryKind.DISCLOSURE) \
            and not isinstance(payload["client"], str):
        raise ValueError(f"{kind.value} payload: client must be a string")
    if kind is EntryKind.CLIENT_DROPPED and not isinstance(payload.get("accused", ""), str):
        raise ValueError("client_dropped payload: accused must be a client id")
