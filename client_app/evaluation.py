"""The site's worker for a job: training rows for a training job, held-out rows for an
evaluation job, and the site's ledger of the models it scored.

A site scores a given model on given held-out rows for one evaluation job only. An evaluation
job asks its one question once (:class:`~fedforest_secure.evaluation.worker.EvalWorker`), but a
server could create a second job that asks the same question over fewer sites and subtract the
two sums; the ledger (``<state dir>/evaluations.jsonl``: one line per job with the digests of
the models and of the held-out rows) makes the site refuse any job that scores a model it
already scored on the same rows in another job. A site that means to repeat an evaluation (a
job that failed before its sum was released) deletes that job's line.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError, RefusedRequest
from fedforest_secure.evaluation.worker import EvalWorker
from fedforest_secure.federation import client_seed
from fedforest_secure.files import append_line, write_atomic
from fedforest_secure.protocol import Reply, Task
from fedforest_secure.worker import Worker

__all__ = ["EvalLedger", "LedgeredEvalWorker", "SiteWorker", "site_worker", "table_digest"]

_Table = tuple[np.ndarray, np.ndarray]


def table_digest(X: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of a table's values (rows in order)."""
    h = hashlib.sha256()
    for arr in (np.ascontiguousarray(X, dtype=np.float64), np.ascontiguousarray(y)):
        h.update(str(arr.shape).encode() + arr.dtype.str.encode())
        h.update(arr.tobytes())
    return h.hexdigest()


class EvalLedger:
    """``<state dir>/evaluations.jsonl``: which models this site scored on which rows, per job."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / "evaluations.jsonl"

    def _entries(self) -> list[dict[str, object]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()
                if line.strip()]

    def check_and_record(self, job: str, models: tuple[str, ...], rows: str, *,
                         record: bool = True, statistics: tuple[str, ...] = ()) -> None:
        """Refuse (:class:`RefusedRequest`) if another job scored one of ``models`` (file
        digests) on ``rows``, or had this site send the same statistics for a model
        (``statistics``: digests of the noise-free per-model statistics; the same forest in
        a re-formatted or renamed file gives the same ones); else record this job (once;
        ``record=False``: only the check).

        The check and the record are one step under the ledger's lock (``.evaluations.lock``
        beside it): clients of two evaluation jobs sharing the state directory can neither
        both pass the check for one model nor lose each other's lines."""
        with self._locked():
            self._check_and_record(job, models, rows, record=record, statistics=statistics)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # a file of its own: the ledger itself is replaced when a job's line is rewritten
        fd = os.open(self.path.with_name(".evaluations.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _check_and_record(self, job: str, models: tuple[str, ...], rows: str, *,
                          record: bool, statistics: tuple[str, ...]) -> None:
        mine = False
        for e in self._entries():
            if e.get("rows") != rows:
                continue
            if e.get("job") == job:
                mine = True
                continue
            before = e.get("job")
            for key, ours, what in (
                    ("models", models, "scores model {} on the held-out rows this site "
                                       f"already scored it on in job {before!r}"),
                    ("statistics", statistics, "asks this site for the statistics of a model "
                                               "on these held-out rows that it already sent "
                                               f"in job {before!r} (model {{}})")):
                theirs = e.get(key)
                again = sorted(set(ours) & {str(m) for m in theirs}) \
                    if isinstance(theirs, list) else []
                if again:
                    raise RefusedRequest(
                        f"job {job!r} " + what.format(again[0][:16] + "...") + "; a second "
                        "evaluation could isolate this site by differencing. Refusing (to "
                        f"repeat an evaluation on purpose, delete job {before!r}'s line from "
                        f"{self.path})", code="evaluated_before")
        if record:
            entry = {"job": job, "models": list(models), "rows": rows}
            if statistics:
                entry["statistics"] = list(statistics)
            if mine:  # this job's line again, now with its statistics
                others = [json.dumps(e, sort_keys=True) for e in self._entries()
                          if e.get("job") != job]
                write_atomic(self.path, "".join(f"{line}\n" for line in others)
                             + json.dumps(entry, sort_keys=True) + "\n")
            else:
                append_line(self.path, json.dumps(entry, sort_keys=True))


class LedgeredEvalWorker:
    """An :class:`EvalWorker` that checks the ledger before its statistics leave the site."""

    def __init__(self, worker: EvalWorker, ledger: EvalLedger, rows: str) -> None:
        self.inner = worker
        self._ledger = ledger
        self._rows = rows

    @property
    def n_rows(self) -> int:
        return self.inner.n_rows

    def check(self) -> None:
        """The ledger's refusal, before the site joins (nothing is recorded)."""
        self._ledger.check_and_record(self.inner.config.job_id, self.inner.spec.digests,
                                      self._rows, record=False)

    def handle(self, task: Task) -> Reply:
        job, models = self.inner.config.job_id, self.inner.spec.digests
        self._ledger.check_and_record(job, models, self._rows, record=False)
        reply = self.inner.handle(task)  # stays here unless the ledger lets it go
        self._ledger.check_and_record(job, models, self._rows,
                                      statistics=self.inner.fingerprints)
        return reply


#: What answers a job's tasks at a site.
SiteWorker = Worker | LedgeredEvalWorker


def site_worker(config: JobConfig, index: int, train: _Table | None, held_out: _Table | None,
                state_dir: Path) -> SiteWorker:
    """The worker of the job's kind, on the table that kind needs."""
    if config.evaluation is None:
        if train is None:
            raise FedForestError(f"job {config.job_id!r} trains a forest: pass the site's "
                                 "table with --data")
        return Worker(config, *train, client_index=index, seed=client_seed(config, index))
    if held_out is None:
        raise FedForestError(f"job {config.job_id!r} is an evaluation job: pass the site's "
                             "held-out rows with --eval-data (a CSV with the same schema)")
    worker = EvalWorker(config, *held_out)
    return LedgeredEvalWorker(worker, EvalLedger(state_dir), table_digest(*held_out))
