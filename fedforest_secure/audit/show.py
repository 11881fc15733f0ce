"""Render a log as rich tables: per job, one row per entry, per-client plaintext flagged.

A log can come from another party (the copy of its job's log a server serves a site), which
writes its text: each cell and title is a :class:`~rich.text.Text`, so rich markup in it is
shown as it is, and holds the text :func:`~fedforest_secure.printable.printable`, so a
terminal escape sequence, a carriage return or a U+2028 is shown as ``\\x1b``, ``\\r``,
``\\u2028``."""

from __future__ import annotations

import json
from typing import Any

from rich.table import Table
from rich.text import Text

from ..errors import AuditError
from ..printable import printable
from .entry import Entry
from .kinds import EntryKind
from .log import AuditLog
from .views import is_per_client_plaintext, summarize_array

__all__ = ["render_tables"]

_MAX_CLIENTS = 6
_MAX_TEXT = 80


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."


def _text(text: str, style: str = "") -> Text:
    """A cell showing ``text`` as text: its markup as it is, escaped (:func:`printable`)."""
    return Text(printable(text), style)


def _clients(names: list[Any]) -> str:
    shown = ", ".join(str(n) for n in names[:_MAX_CLIENTS])
    more = len(names) - _MAX_CLIENTS
    return f"{shown} (+{more})" if more > 0 else shown


def _layout(payload: dict[str, Any]) -> str:
    blocks = payload.get("layout") or []
    parts = [f"{b.get('name')}{tuple(b.get('shape', ()))}" for b in blocks if isinstance(b, dict)]
    return _clip(" ".join(parts))


def _aggregate(log: AuditLog, entry: Entry, name: str, held: bool) -> str:
    try:
        if not held and name not in log.stored_arrays(entry.job_id, entry.seq):
            info = entry.arrays.get(name)
            if info is not None:  # a site's copy of its job's log: the digest, no bytes
                return f"size={info.size} (not in this copy of the log)"
        return str(summarize_array(log.array(entry, name)))
    except (AuditError, KeyError, ValueError) as exc:  # a damaged entry: verify names it
        return f"UNREADABLE ({exc})"


#: shown first (a DP spend's running total before its own share, which alone does not add
#: up to the job's budget), the rest in name order
_FIRST = ("total_epsilon", "total_delta", "epsilon", "delta")


def _value(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else json.dumps(v, sort_keys=True)


def _details(payload: dict[str, Any]) -> str:
    skip = {"round_id", "clients", "uploads", "layout", "params", "task_digest"}
    rest = {k: v for k, v in payload.items() if k not in skip and v not in (None, "", [])}
    keys = [k for k in _FIRST if k in rest] + sorted(k for k in rest if k not in _FIRST)
    return _clip(" ".join(f"{k}={_value(rest[k])}" for k in keys))


def _row(log: AuditLog, entry: Entry, held: bool) -> list[Text]:
    """The cells of ``entry``'s row, each :func:`_text`."""
    when = entry.timestamp[:19].replace("T", " ")  # ISO 8601 in UTC, to the second
    try:
        payload = entry.payload
    except ValueError:
        return [_text(c) for c in (str(entry.seq), when, entry.kind, "", "", "", "")] \
            + [_text("UNREADABLE", "bold red")]
    round_id = "" if entry.round_id is None else str(entry.round_id)
    clients, layout, aggregate = "", "", ""
    if entry.kind == EntryKind.ROUND.value:
        clients = _clients(list(payload.get("clients", [])))
        kind = f"round/{payload.get('task_kind', '?')}"
        layout = _layout(payload)
        aggregate = _aggregate(log, entry, "aggregate", held)
        note = _text("masked uploads, sum only") if payload.get("masked") is True \
            else _text("PLAINTEXT uploads: per-client vectors seen", "bold red")
    elif entry.kind == EntryKind.DISCLOSURE.value:
        kind = entry.kind
        clients = str(payload.get("client", ""))
        aggregate = _aggregate(log, entry, "data", held)
        note = _text(f"PER-CLIENT PLAINTEXT: {payload.get('item', '?')}", "bold red")
    else:
        kind = entry.kind
        if "client" in payload:
            clients = str(payload["client"])
        note = _text(_details(payload))
    return [*(_text(c) for c in (str(entry.seq), when, kind, round_id, clients, layout,
                                 aggregate)), note]


def render_tables(log: AuditLog, job_id: str | None = None,
                  round_id: int | None = None, *, arrays_held: bool = True) -> list[Table]:
    """One table per job of what the server saw (only ``round_id``'s entries if given);
    ``arrays_held=False``: the log holds entries without their arrays' bytes (a site's copy
    of its job's log), whose sizes are shown instead."""
    jobs = [job_id] if job_id is not None else log.jobs()
    tables = []
    for job in jobs:
        entries = log.entries(job_id=job, round_id=round_id)
        flagged = sum(is_per_client_plaintext(e) for e in entries)
        caption = (f"{flagged} entr{'y' if flagged == 1 else 'ies'} with per-client plaintext"
                   if flagged else "no per-client plaintext")
        table = Table(title=_text(f"audit log of job {job!r} (head {log.head(job)[:16]}...)"),
                      caption=caption)
        for column in ("seq", "time (UTC)", "kind", "round", "clients", "layout", "aggregate",
                       "notes"):
            table.add_column(column, overflow="fold")
        for entry in entries:
            table.add_row(*_row(log, entry, arrays_held))
        tables.append(table)
    return tables
