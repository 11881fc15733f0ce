"""RESIDUAL (threat_model.md §10, "Differencing across training jobs"): a site's record of the
questions it answered is per training job, so a server that runs a second job over fewer sites
and asks it the first job's questions gets, under ``secure``, the missing site's exact sums by
difference. Evaluation jobs keep a ledger across jobs (E3); training jobs do not."""

from __future__ import annotations

import dataclasses

import numpy as np
from test_adversarial_server import _secure_config, _workers

from fedforest_secure.coordinator import Coordinator
from fedforest_secure.protocol import Task, TaskKind


def _in_job(job: str, t: Task) -> Task:
    return Task(job_id=job, round_id=t.round_id, kind=t.kind, level=t.level, params=t.params,
                arrays=t.arrays, layout=t.layout, disclose=t.disclose)


def test_residual_a_second_training_job_over_fewer_sites_isolates_a_sites_histogram() -> None:
    cfg, clients = _secure_config("secure")
    sites = _workers(cfg, clients)
    coord = Coordinator(cfg)
    asked = []
    task = coord.next_task()
    while task is not None and task.kind is not TaskKind.HISTOGRAM:
        asked.append(task)
        replies = [w.handle(task) for w in sites]
        coord.submit(task.round_id, sum(r.summable for r in replies),
                     participants=list(range(len(sites))))
        task = coord.next_task()
    assert task is not None
    first = {k: w.handle(task).summable for k, w in enumerate(sites)}
    # the second job: the same configuration over sites 0-2, asked the first job's questions
    cfg_b = dataclasses.replace(cfg, job_id="job-b", n_clients=3)
    sites_b = _workers(cfg_b, clients[:3])
    for t in asked:
        for w in sites_b:
            w.handle(_in_job("job-b", t))
    second = sum(w.handle(_in_job("job-b", task)).summable for w in sites_b)
    assert np.allclose(sum(first.values()) - second, first[3])
    assert np.any(first[3] != 0)
