"""Where the long tests go under ``pytest -n N --dist worksteal`` (tests/worker_order.py),
checked against pytest-xdist's own scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from worker_order import first_shares, split_at_groups, spread
from xdist.scheduler.worksteal import WorkStealingScheduling


@dataclass
class _Config:
    """What the scheduler reads of pytest's configuration: ``--tx N*popen``."""

    workers: int

    def getvalue(self, name: str) -> Any:
        assert name == "tx", name
        return [f"{self.workers}*popen"]


@dataclass(eq=False)
class _Worker:
    """A worker as the scheduler sees it: it records the tests it is sent."""

    name: str
    sent: list[int] = field(default_factory=list)
    shutting_down: bool = False

    @property
    def gateway(self) -> SimpleNamespace:
        return SimpleNamespace(id=self.name)

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:  # told when there is nothing left to give it
        self.shutting_down = True


def _xdist_shares(order: list[str], workers: int) -> list[list[str]]:
    """The tests each worker is first given by xdist's worksteal scheduler, for ``order``."""
    sched = WorkStealingScheduling(_Config(workers))  # type: ignore[arg-type]
    nodes = [_Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)  # type: ignore[arg-type]
    for node in nodes:
        sched.add_node_collection(node, order)  # type: ignore[arg-type]
    sched.schedule()
    return [[order[i] for i in node.sent] for node in nodes]


@pytest.mark.parametrize(("total", "workers"), [(10, 3), (3536, 3), (7, 4), (5, 2), (2, 3)])
def test_the_first_shares_are_those_xdist_hands_out(total: int, workers: int) -> None:
    shares = _xdist_shares([f"t{i}" for i in range(total)], workers)
    assert [len(s) for s in shares] == first_shares(total, workers)


def _tests(module: str, n: int) -> list[str]:
    return [f"{module}::test_{i}" for i in range(n)]


def _module(test: str) -> str:
    return test.split("::")[0]


def test_the_long_tests_start_the_first_shares_and_the_last_has_none() -> None:
    long = _tests("a", 4) + _tests("b", 3) + _tests("c", 5)
    short = _tests("s", 60)
    order = spread(long, short, 3, _module)
    assert sorted(order) == sorted(long + short)
    first, second, last = _xdist_shares(order, 3)
    assert first[:7] == long[:7] and second[:5] == long[7:]  # cut between modules b and c
    assert not any(t in long for t in first[7:] + second[5:] + last)
    assert [t for t in order if t in short] == short  # each group in its own order


def test_with_one_or_two_workers_the_long_tests_come_first() -> None:
    long, short = _tests("a", 3), _tests("s", 10)
    assert spread(long, short, 1, _module) == long + short
    assert spread(long, short, 2, _module) == long + short
    assert spread([], short, 3, _module) == short


def test_a_module_is_never_split_between_shares() -> None:
    long = _tests("a", 2) + _tests("b", 9) + _tests("c", 1)
    parts = split_at_groups(long, 2, _module)
    assert [len(p) for p in parts] == [2, 10]  # the change nearest the middle
    assert split_at_groups(_tests("a", 5), 2, _module) == [_tests("a", 5), []]
