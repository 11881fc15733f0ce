"""Joining every site of a job on an in-process :class:`ServerState`, with a worker per site."""

from __future__ import annotations

import json

import numpy as np
from sqlalchemy import select

from fedforest_secure.config import JobConfig
from fedforest_secure.federation import client_seed
from fedforest_secure.worker import Worker
from server_app.db import ClientRow, Database
from server_app.runtime import ServerState


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
