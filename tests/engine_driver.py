"""Driving an in-process coordinator and its workers in engine tests, and a two-leaf tree."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedforest_secure._tree import NodeKind, TreeBuilder
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.protocol import Task
from fedforest_secure.worker import Worker


def released_tasks(coord: Coordinator, workers: Sequence[Worker]) -> list[Task]:
    """Run ``coord`` to its end, every worker answering every task and the coordinator getting
    the plain sum of their vectors; returns the tasks that asked a summable vector."""
    released = []
    task = coord.next_task()
    while task is not None:
        replies = [w.handle(task) for w in workers]
        if task.layout:
            released.append(task)
        coord.submit(task.round_id, np.sum([r.summable for r in replies], axis=0),
                     participants=range(len(workers)))
        task = coord.next_task()
    return released


def stump() -> TreeBuilder:
    """A root split at ``x0 <= 0.5`` with two leaves (nodes 0, 1, 2) of a two-output tree."""
    tb = TreeBuilder(2)
    root, left, right = tb.add(), tb.add(), tb.add()
    tb.left[root], tb.right[root] = left, right
    tb.kind[root], tb.feature[root], tb.threshold[root] = NodeKind.NUMERIC, 0, 0.5
    return tb
