"""The site's worker for a job: training rows for a training job, held-out rows for an
evaluation job, and the site's ledger of the evaluations it answered.

An evaluation job asks its one question once (:class:`~fedforest_secure.evaluation.worker.
EvalWorker`), but a server could create a second job that asks the same question (the same
forest in another file, its trees reordered, other bins, a constant tree added) over another
set of sites and subtract the two sums. The ledger (``<state dir>/evaluations.jsonl``, one line
per job) keeps, per job, the digests of the models, of the held-out rows (in any order) and of
the job's configuration. A site answers one evaluation job per held-out set: it refuses
(``evaluated_before``) any other evaluation job on rows it already answered one on, whatever
its models. Its operator may allow more evaluations on the same rows (``--evaluate-again``,
``again``): then only a job that scores a model (file digest) the site already scored on those
rows is refused. Any earlier job counts: a site cannot tell which sites' answers a sum holds
(the server may leave any site out of a round at its deadline). A site that means to repeat an
evaluation (a job that failed before its sum was released) deletes that job's line.

Whether a site takes part depends only on these facts, never on its rows' values: the server
learns from a refusal only that the site answered another evaluation on the same held-out rows
(that its held-out set did not change), not where its rows lie (a per-site statistic compared
with an earlier job's would tell the server, for a model B that differs from an earlier one on
a small box, whether the site has a row there).

A job's id is the server's word, so each line also keeps a digest of the job's configuration as
the server sent it (:func:`_evaluation_digest`: the number of clients, the profile, the
models, the bins, the task; everything a restart of the job keeps, and nothing this client's
version fills in: a client upgraded in the middle of a job still knows its line). A line of another
configuration under the same id is checked like any other job's (by the ledger: under secure
aggregation a site whose receipts record an upload in a job of that id refuses, once joined,
every round of it, as after a restart; docs/deployment.md §5). A line of the same job and
configuration is this job met again: before joining it is passed over (a restarted client
joins; under secure aggregation it then leaves the round it answered, whose keys died with the
old process). When the statistics are about to leave, it is passed over only if this client
wrote it (a retried round) or the job has no secure aggregation (a restarted client sends the
same upload again, and every upload is per-site in the clear anyway). Otherwise the job asks a
question this site already answered in it, and the sum could hold another set of sites (a
re-created job, a site dropped or replaced): refused.

Ledgers written by earlier versions keyed some lines by a digest of the rows in file order:
such a line counts for the same rows in the same order. A line without the configuration's
digest (written before it was kept) is checked like another job's, whatever its job id: a
client restarted across that upgrade in the middle of its job declines the job, naming the
line to delete. Their other fields (digests and sums of the statistics the site sent) are not
read.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError, RefusedRequest
from fedforest_secure.files import append_line, open_in_place, write_atomic
from fedforest_secure.protocol import Reply, Task
from fedforest_secure.worker import Worker, client_seed

if TYPE_CHECKING:
    from fedforest_secure.evaluation.worker import EvalWorker

__all__ = ["EvalLedger", "LedgeredEvalWorker", "SiteWorker", "site_worker", "table_digest"]

_Table = tuple[np.ndarray, np.ndarray]


def table_digest(X: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of a table's rows whatever their order (the rows sorted, then hashed)."""
    X = np.asarray(X, dtype=np.float64) + 0.0  # -0.0 as 0.0: they sort as equals
    y = np.asarray(y)
    # sorted by the first column, then the next, ..., then the target (lexsort's last key
    # is its first); equal rows are equal bytes, so their order does not matter
    order = np.lexsort([np.unique(y, return_inverse=True)[1].reshape(-1), *X.T[::-1]])
    h = hashlib.sha256(b"fedforest/rows-any-order/v1")
    for arr in (np.ascontiguousarray(X[order]), np.ascontiguousarray(y[order])):
        h.update(str(arr.shape).encode() + arr.dtype.str.encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def _table_digest_in_order(X: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of a table's values, rows in file order: the rows key of older ledgers."""
    h = hashlib.sha256()
    for arr in (np.ascontiguousarray(X, dtype=np.float64), np.ascontiguousarray(y)):
        h.update(str(arr.shape).encode() + arr.dtype.str.encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def _evaluation_digest(sent: Mapping[str, Any]) -> str:
    """SHA-256 of an evaluation job's configuration as the server sent it (the JSON object of
    the job offer, keys sorted), before this client reads in its own defaults: what tells a
    restart of the job (the same configuration: the server keeps it and sends it as it was)
    from another evaluation under the same id (another number of clients, profile, models or
    bins), whatever version of the client reads it."""
    canonical = json.dumps(sent, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(b"fedforest/evaluation-job/v2\0" + canonical.encode()).hexdigest()


class EvalLedger:
    """``<state dir>/evaluations.jsonl``: which evaluation jobs this site answered, on which
    held-out rows, with which models."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / "evaluations.jsonl"

    def _entries(self) -> list[dict[str, object]]:
        """The ledger's lines; ``ValueError`` naming the file and line for one that is not an
        entry (not a decline reason: the site's own file needs mending)."""
        if not self.path.exists():
            return []
        entries: list[dict[str, object]] = []
        for number, line in enumerate(self.path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError as exc:
                entry = exc
            if not isinstance(entry, dict):
                raise ValueError(
                    f"{self.path} line {number} is not a ledger entry ({entry}). A client "
                    "stopped while writing its line leaves it cut short, and that job's "
                    "statistics were never sent: then delete that line (keep the others: "
                    "they keep this site from being isolated by a second evaluation)")
            entries.append(entry)
        return entries

    def check_and_record(self, job: str, models: tuple[str, ...], rows: str, *,
                         evaluation: str, resumed: bool, record: bool = True,
                         again: bool = False, check: bool = True,
                         rows_in_order: str | None = None) -> None:
        """Refuse (:class:`RefusedRequest`, code ``evaluated_before``) if another job on
        ``rows`` (or, for older lines, ``rows_in_order``) is in the ledger (with ``again``,
        the site's ``--evaluate-again``: only if that job scored one of ``models``, file
        digests); else record this job (once; ``record=False``: only the check; ``check=False``:
        only the record). Nothing
        here reads the rows' values: a refusal tells the server only that this site answered
        another evaluation on the same rows.

        ``evaluation`` (:func:`_evaluation_digest`) identifies the evaluation: a line of
        ``job`` with another one (or none) is another job's. A line of ``job`` and
        ``evaluation`` on ``rows`` is passed over if ``resumed`` (this job resumed, or this
        client's own line), else refused (the job's question asked a second time).

        The check and the record are one step under the ledger's lock (``.evaluations.lock``
        beside it): clients of two evaluation jobs sharing the state directory can neither
        both pass the check nor lose each other's lines."""
        with self._locked():
            if check:
                self._check(job, models,
                            {rows} | ({rows_in_order} if rows_in_order else set()),
                            evaluation, resumed, again)
            if record:
                self._record(job, models, rows, evaluation)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # a file of its own: the ledger itself is replaced when a job's line is rewritten
        # never through a link, nor a file of another name (open_in_place)
        fd = open_in_place(self.path.with_name(".evaluations.lock"), os.O_RDWR | os.O_CREAT,
                           0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _refuse(self, job: str, before: object, what: str, *,
                again_helps: bool = False) -> RefusedRequest:
        anyway = ("to answer it all the same, with a server you trust, start the client with "
                  "--evaluate-again; " if again_helps else "")
        return RefusedRequest(
            f"job {job!r} {what}; a second evaluation could isolate this site by "
            f"differencing. Refusing ({anyway}to repeat an evaluation on purpose, delete job "
            f"{before!r}'s line from {self.path})", code="evaluated_before")

    def _check(self, job: str, models: tuple[str, ...], rows: set[str], evaluation: str,
               resumed: bool, again: bool) -> None:
        for e in self._entries():
            if e.get("rows") not in rows:
                continue
            before = e.get("job")
            if before == job and e.get("evaluation") == evaluation:
                if resumed:
                    continue
                raise self._refuse(job, before, (
                    "asks this site again for the statistics it already answered in this "
                    "job (the line of an earlier client of this job in this state directory): "
                    "a restarted client does not answer a secure round again (its round keys "
                    "died with the old process), so this is the job's question asked a second "
                    "time, and its sum may hold another set of sites"))
            # a line of this job id but of another configuration (or none) is another job's
            earlier = f"job {before!r}" if before != job else (
                f"an earlier job also named {before!r} (of another configuration)")
            theirs = e.get("models")
            scored = sorted(set(models) & {str(m) for m in theirs}) \
                if isinstance(theirs, list) else []
            if scored:
                raise self._refuse(job, before, (
                    f"scores model {scored[0][:16]}... on the held-out rows this site already "
                    f"scored it on in {earlier}"))
            if not again:
                raise self._refuse(job, before, (
                    "is another evaluation of the held-out rows this site already answered in "
                    f"{earlier} (a site answers one evaluation job per held-out set)"),
                    again_helps=True)

    def _record(self, job: str, models: tuple[str, ...], rows: str, evaluation: str) -> None:
        entry: dict[str, object] = {"job": job, "models": list(models), "rows": rows,
                                    "evaluation": evaluation}
        entries = self._entries()

        def ours(e: Mapping[str, object]) -> bool:
            return e.get("job") == job and e.get("evaluation") == evaluation

        if any(ours(e) for e in entries):  # this evaluation's line again
            # (the lines of other evaluations under the same id stay)
            others = [json.dumps(e, sort_keys=True) for e in entries if not ours(e)]
            write_atomic(self.path, "".join(f"{line}\n" for line in others)
                         + json.dumps(entry, sort_keys=True) + "\n")
        else:
            # on disk before the statistics it stands for leave the site
            append_line(self.path, json.dumps(entry, sort_keys=True), sync=True)


class LedgeredEvalWorker:
    """An :class:`EvalWorker` that checks the ledger before its statistics leave the site;
    ``again``: the site's ``--evaluate-again`` (another evaluation on rows it answered one on
    is allowed, a model it already scored on them is not)."""

    def __init__(self, worker: EvalWorker, ledger: EvalLedger, rows: str,
                 rows_in_order: str | None = None, *,
                 sent: Mapping[str, Any] | None = None, again: bool = False) -> None:
        self.inner = worker
        self._ledger = ledger
        self._rows = rows
        self._rows_in_order = rows_in_order
        self._again = again
        # the configuration as the server sent it (``sent``), else as the worker's reads
        self._evaluation = _evaluation_digest(
            sent if sent is not None else json.loads(worker.config.to_json()))
        # without secure aggregation every upload is the site's own, in the clear: there is no
        # sum to difference, so the ledger only records the job (and a restarted client sends
        # its same upload again)
        self._in_clear = worker.config.profile.get("secure_aggregation") is False
        self._recorded = False  # whether this client wrote the job's line

    @property
    def n_rows(self) -> int:
        return self.inner.n_rows

    def _ledgered(self, *, record: bool, answering: bool) -> None:
        self._ledger.check_and_record(
            self.inner.config.job_id, self.inner.spec.digests, self._rows,
            evaluation=self._evaluation,
            resumed=not answering or self._recorded, record=record, again=self._again,
            check=not self._in_clear, rows_in_order=self._rows_in_order)
        self._recorded = self._recorded or record

    def check(self) -> None:
        """The ledger's refusal, before the site joins (nothing is recorded). A line of this
        job and configuration is passed over: a restarted client joins, and under secure
        aggregation leaves the round it answered (its round keys died)."""
        self._ledgered(record=False, answering=False)

    def handle(self, task: Task) -> Reply:
        """The inner worker's reply, once the ledger lets it leave (the same facts as
        :meth:`check`'s): a line of this job and configuration that this client did not
        write refuses it under secure aggregation."""
        self._ledgered(record=False, answering=True)
        reply = self.inner.handle(task)  # stays here unless the ledger lets it go
        self._ledgered(record=True, answering=True)
        return reply


#: What answers a job's tasks at a site.
SiteWorker = Worker | LedgeredEvalWorker


def site_worker(config: JobConfig, index: int, train: _Table | None, held_out: _Table | None,
                state_dir: Path, *, sent: Mapping[str, Any] | None = None,
                evaluate_again: bool = False) -> SiteWorker:
    """The worker of the job's kind, on the table that kind needs; an evaluation job's knows
    itself in the ledger by ``sent``, the configuration as the server sent it (default:
    ``config``'s), and takes part in another evaluation of rows it answered one on only with
    ``evaluate_again`` (the site's ``--evaluate-again``)."""
    if config.evaluation is None:
        if train is None:
            raise FedForestError(f"job {config.job_id!r} trains a forest: pass the site's "
                                 "table with --data")
        return Worker(config, *train, client_index=index, seed=client_seed(config, index))
    if held_out is None:
        raise FedForestError(f"job {config.job_id!r} is an evaluation job: pass the site's "
                             "held-out rows with --eval-data (a CSV with the same schema)")
    # a training job's site never loads the evaluation's statistics
    from fedforest_secure.evaluation.worker import EvalWorker

    worker = EvalWorker(config, *held_out)
    return LedgeredEvalWorker(worker, EvalLedger(state_dir), table_digest(*held_out),
                              _table_digest_in_order(*held_out), sent=sent,
                              again=evaluate_again)
