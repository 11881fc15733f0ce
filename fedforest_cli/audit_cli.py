"""``fedforest audit show|verify|export``: inspect, verify and export an audit log.

``--db`` takes a SQLite file path or any SQLAlchemy URL. ``verify`` exits with 0 only if the
chains, the stored arrays and the given receipts all agree to the job's end, and prints every
problem otherwise (exit code 1); a job that has not ended in the log (still running, or a log
cut before its end) is verified as far as the log goes, and the verdict says so (``OK so far:
...``, exit code 3: not a pass).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import gzip
import io
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from fedforest_secure.errors import AuditError
from fedforest_secure.files import replacing
from fedforest_secure.printable import printable

from ._common import check_output, fail

#: ``verify``'s exit code when nothing disagrees but a job has not ended in the log: not a pass
RUNNING_EXIT = 3

if TYPE_CHECKING:
    from fedforest_secure.audit import AuditLog
    from fedforest_secure.audit.entry import Entry

__all__ = ["audit_app"]

audit_app = typer.Typer(help="Inspect, verify and export an audit log.", no_args_is_help=True)

DbOption = Annotated[str, typer.Option(
    "--db", help="SQLite file path or SQLAlchemy URL, or a JSON-lines export (.jsonl, "
                 ".jsonl.gz). Other users of this machine can read a command line: give a "
                 "PostgreSQL password in ~/.pgpass or PGPASSWORD, not in the URL.")]
JobOption = Annotated[str | None, typer.Option("--job", help="Only this job.")]


class ExportFormat(enum.StrEnum):
    JSONL = "jsonl"
    CSV = "csv"


def _table_console() -> Console:
    """A console for tables: the terminal's width, or a wide one when output is redirected."""
    console = Console(emoji=False)
    return console if console.is_terminal else Console(width=200, emoji=False)


def _is_export(db: str) -> bool:
    """``--db`` names a JSON-lines export (``.jsonl``, ``.jsonl.gz``: what ``audit export``
    writes and ``GET /v1/jobs/{job}/audit`` serves), not a database."""
    return db.endswith((".jsonl", ".jsonl.gz")) and Path(db).is_file()


def _read_export(db: str) -> list[tuple[Entry, dict[str, bytes] | None]]:
    """The entries of an export and their array bytes, ``None`` where the export holds none
    (a member's copy of its job's log) (:class:`AuditError` if unreadable)."""
    from fedforest_secure.audit import read_jsonl

    path = Path(db)
    try:
        with (gzip.open(path, "rt", encoding="utf-8") if db.endswith(".gz")
              else path.open(encoding="utf-8")) as fh:
            return read_jsonl(fh)
    except (OSError, UnicodeDecodeError, EOFError, zlib.error) as exc:  # zlib: bad deflate data
        raise AuditError(f"cannot read the export {db}: {exc}") from None


def _load(entries: list[tuple[Entry, dict[str, bytes] | None]]) -> AuditLog:
    """An in-memory log holding an export's entries as they are (chains checked on import;
    an entry without its arrays' bytes is kept without them)."""
    from fedforest_secure.audit import AuditLog

    log = AuditLog.in_memory()
    for entry, blobs in entries:
        log.import_entry(entry, blobs)
    return log


@contextlib.contextmanager
def _as_error(console: Console) -> Iterator[None]:
    """An :class:`AuditError` inside, or a row the database cannot return (a value changed
    behind the log's back): the one-line error, exit code 1."""
    from sqlalchemy.exc import DBAPIError

    from fedforest_secure.audit.verify import unreadable

    try:
        yield
    except (AuditError, DBAPIError) as exc:
        said = printable(unreadable("rows", exc))  # it may quote the log's text: one line
        console.print(f"[red]error:[/red] {escape(said)}", soft_wrap=True)
        raise typer.Exit(code=1) from None


def _held(entries: list[tuple[Entry, dict[str, bytes] | None]]) -> bool:
    """Whether an export holds every entry's arrays (the server's whole log) or none (a
    site's copy of its job's log, unless the server sets ``audit_arrays_for_sites``);
    :class:`AuditError` for an export that holds some lines' arrays and not others'."""
    held = [blobs is not None for _, blobs in entries]
    if any(held) and not all(held):
        missing = next(e.label for e, blobs in entries if blobs is None)
        raise AuditError(f"{missing} comes without its array data, beside entries that hold "
                         "theirs: the export is neither the server's whole log nor a site's "
                         "copy without arrays (a line's \"data\" was removed)")
    return all(held)


def _open(db: str, console: Console) -> tuple[AuditLog, bool]:
    """The log ``db`` names, and whether it holds the arrays of its entries."""
    from fedforest_secure.audit import AuditLog  # SQLAlchemy: loaded by audit commands only

    try:
        if _is_export(db):
            entries = _read_export(db)
            return _load(entries), _held(entries)
        return AuditLog(db, create=False), True
    except AuditError as exc:
        console.print(f"[red]error:[/red] {escape(printable(str(exc)))}")  # quotes the log
        raise typer.Exit(code=1) from exc


@audit_app.command()
def show(
    db: DbOption,
    job: JobOption = None,
    round_id: Annotated[int | None, typer.Option("--round", help="Only this round.")] = None,
) -> None:
    """Show what the server saw: per round clients, layout, aggregate; disclosures flagged."""
    from fedforest_secure.audit import render_tables

    console = _table_console()
    opened, held = _open(db, console)
    with opened as log, _as_error(console):
        if job is not None and job not in log.jobs():
            console.print(f"[red]error:[/red] job {escape(repr(job))} is not in the log")
            raise typer.Exit(code=1)
        if round_id is not None and not log.entries(job_id=job, round_id=round_id):
            console.print(f"[red]error:[/red] round {round_id} is not in the log"
                          + (f" of job {escape(repr(job))}" if job is not None else ""))
            raise typer.Exit(code=1)
        tables = render_tables(log, job_id=job, round_id=round_id, arrays_held=held)
        if not tables:
            console.print("the audit log is empty")
        for table in tables:
            console.print(table)


@audit_app.command()
def verify(
    db: DbOption,
    receipts: Annotated[Path | None, typer.Option(
        "--receipts", help="Directory of client receipts (*.jsonl) to cross-check.")] = None,
    job: JobOption = None,
    replay: Annotated[bool, typer.Option(
        "--replay", help="Also replay every round through the coordinator: each logged task "
        "digest and the model digest must follow from the logged configuration and "
        "aggregates.")] = False,
) -> None:
    """Check hash chains, stored arrays and receipts; exit code 0 if all agree to the job's
    end, 1 if anything disagrees, 3 if nothing disagrees but the job has not ended in the log
    (still running, or a log cut before its end). --db may also name a JSON-lines export
    (.jsonl, .jsonl.gz), as a member fetches its job's log."""
    from fedforest_secure.audit import VerifyReport, verify_entries, verify_log

    report: VerifyReport
    if _is_export(db):
        try:
            entries = _read_export(db)
        except AuditError as exc:
            report = VerifyReport(problems=[str(exc)])
        else:  # every broken link listed first; a sound chain is then verified in full
            report = verify_entries(e for e, _ in entries)
            if report.ok:
                try:
                    report = verify_log(_load(entries), receipts_dir=receipts, job_id=job,
                                        replay=replay, arrays_held=_held(entries))
                except AuditError as exc:
                    report = VerifyReport(problems=[str(exc)])
    else:
        report = verify_log(db, receipts_dir=receipts, job_id=job, replay=replay)
    # one line each, the log's text (another party's) escaped
    for problem in report.problems:
        typer.echo(printable(f"PROBLEM {problem}"))
    for note in report.notes:
        typer.echo(printable(f"NOTE {note}"))
    summary = (f"{report.entries_checked} entries in {len(report.jobs)} job(s), "
               f"{report.receipts_checked} receipt(s) checked")
    if report.ok and report.running:  # verified as far as the log goes: not to the end
        them = "it ends" if len(report.running) == 1 else "they end"
        typer.echo(printable(f"OK so far: {summary}; {'; '.join(report.running)}: verify "
                             f"again after {them} (a site whose job has ended must see OK: the "
                             "log it was given is cut before the job's end)"))
        raise typer.Exit(code=RUNNING_EXIT)
    if report.ok:
        typer.echo(f"OK: {summary}")
        return
    typer.echo(f"FAILED: {len(report.problems)} problem(s); {summary}")
    raise typer.Exit(code=1)


def _export_to(out: Path, writer: Callable[[AuditLog, IO[str], str | None], int],
               log: AuditLog, job: str | None) -> int:
    """Write the export to the file ``out`` (gzip-compressed if it ends in .gz): a new one
    is its user's only (0600: the log holds the sites' disclosures), a replaced one keeps its
    mode."""
    if out.suffix == ".gz":  # compressed: JSON lines of aggregates shrink ~3-10x
        # the gzip header names the final file, not the temporary one
        with (replacing(out, mode=0o600, keep_mode=True) as tmp, tmp.open("wb") as raw,
              gzip.GzipFile(filename=out.name, mode="wb", fileobj=raw) as gz,
              io.TextIOWrapper(gz, encoding="utf-8", newline="") as text):
            return writer(log, text, job)
    with (replacing(out, mode=0o600, keep_mode=True) as tmp,
          tmp.open("w", encoding="utf-8", newline="") as fp):
        return writer(log, fp, job)


@audit_app.command()
def export(
    db: DbOption,
    fmt: Annotated[ExportFormat, typer.Option("--format", help="jsonl or csv.")],
    out: Annotated[Path | None, typer.Option(
        "--out", help="Output file (default stdout): a new one is its user's only (0600: the "
                      "log holds the sites' disclosures), a replaced one keeps its mode.")] = None,
    job: JobOption = None,
    force: Annotated[bool, typer.Option(help="replace an existing --out file")] = False,
) -> None:
    """Export entries as JSON lines (complete, with arrays; a site's copy of its job's log,
    which holds none, without them) or CSV (metadata and digests); an --out file ending in .gz
    is gzip-compressed."""
    from fedforest_secure.audit import export_csv, export_jsonl
    from fedforest_secure.dburl import sqlite_file

    console = Console(stderr=True, emoji=False)
    if out is not None:
        source = sqlite_file(db)  # a path or a sqlite:/// URL: never written over
        check_output(out, force=force, inputs=[("--db", source)] if source else [])
    opened, held = _open(db, console)
    writer = (functools.partial(export_jsonl, include_arrays=held)
              if fmt is ExportFormat.JSONL else export_csv)
    with opened as log, _as_error(console):
        if job is not None and job not in log.jobs():  # a typo exports nothing, say so
            console.print(f"[red]error:[/red] job {escape(repr(job))} is not in the log; "
                          "nothing was exported")
            raise typer.Exit(code=1)
        if out is None:
            count = writer(log, sys.stdout, job)
        else:
            try:
                count = _export_to(out, writer, log, job)
            except OSError as exc:  # a full disk, a folder this user may not write
                fail(exc)
    console.print(f"exported {count} entries", highlight=False)
