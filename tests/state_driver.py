"""Joining every site of a job on an in-process :class:`ServerState`, with a worker per site,
and answering the job's tasks until it is done."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
from sqlalchemy import select

from fedforest_secure.config import JobConfig
from fedforest_secure.federation import client_seed
from fedforest_secure.protocol import Task, make_upload
from fedforest_secure.worker import Worker
from server_app.db import ClientRow, Database
from server_app.runtime import ServerState, TaskOffer


def join_sites(db: Database, state: ServerState, job: str,
               parts: list[tuple[np.ndarray, np.ndarray]]
               ) -> tuple[list[ClientRow], list[Worker]]:
    """Sites ``client-0`` .. ``client-{K-1}`` (K = ``len(parts)``, registered in ``db``) join
    ``job``; returns their client rows and a worker per site on its part, configured from the
    job configuration the join hands out."""
    with db.session() as s:
        rows = [s.scalar(select(ClientRow).where(ClientRow.name == f"client-{k}"))
                for k in range(len(parts))]
    infos = [state.join(row, job) for row in rows]
    config = JobConfig.from_json(json.dumps(infos[0]["config"]))
    workers = [Worker(config, *part, client_index=k, seed=client_seed(config, k))
               for k, part in enumerate(parts)]
    return rows, workers


def answer_until_done(state: ServerState, job: str, rows: list[ClientRow], workers: list[Worker],
                      *, stop: Callable[[], bool] | None = None,
                      uploaded: Callable[[int, TaskOffer, Task, bytes], None] | None = None
                      ) -> bool:
    """Each site asks for its offer and its worker answers every task, until every site is
    told the job is done (True) or ``stop()`` says to stop first (False); ``uploaded(k, offer,
    task, body)`` sees each upload once the server took it. AssertionError after 500 rounds of
    offers."""
    for _ in range(500):
        if stop is not None and stop():
            return False
        offers = [state.offer(row, job) for row in rows]
        if all(o.status == "done" for o in offers):
            return True
        for k, o in enumerate(offers):
            if o.status != "task":
                continue
            task = Task.from_bytes(o.body)
            reply = workers[k].handle(task)
            body = make_upload(task, np.asarray(reply.summable, dtype=np.float64),
                               reply.disclosed)
            state.upload(rows[k], job, task.round_id, body)
            if uploaded is not None:
                uploaded(k, o, task, body)
    raise AssertionError("the job did not finish")
