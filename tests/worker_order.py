"""The order of the tests for ``pytest -n N --dist worksteal``: where the long tests go.

pytest-xdist's worksteal scheduler first hands each of the N workers one contiguous share of
the collected tests, in order (:func:`first_shares`); a worker that runs out later takes the
second half of the longest queue left. The long tests (marker ``integration``) start servers
and client processes and spend much of their time waiting on them (round deadlines, restarts,
long polls), so a worker running one leaves part of a core idle, while the short tests keep a
core busy. :func:`spread` puts the long tests at the start of the first N - 1 shares, split
between them, and the short ones after them and in the last share: from the start the long
tests run on N - 1 workers beside one that runs short tests, and the run ends on short tests,
instead of ending with every worker on long tests and the cores partly idle. With one or two
workers the long tests simply come first (on two, all in the first share).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

__all__ = ["first_shares", "spread", "split_at_groups"]

T = TypeVar("T")


def first_shares(total: int, workers: int) -> list[int]:
    """How many of ``total`` tests each of ``workers`` idle workers is first given: in turn,
    what is left divided by the workers still without tests (xdist's
    ``WorkStealingScheduling.check_schedule``)."""
    sizes = []
    left = total
    for i in range(workers):
        size = left // (workers - i)
        sizes.append(size)
        left -= size
    return sizes


def split_at_groups(items: Sequence[T], parts: int, group: Callable[[T], Hashable]
                    ) -> list[list[T]]:
    """``items`` cut into ``parts`` consecutive runs of about as many items each, every cut
    moved to the nearest change of ``group`` (a test module's tests stay together, so its
    module-scoped fixtures, a shared server, are set up in one worker)."""
    cuts_at = [i for i in range(1, len(items)) if group(items[i]) != group(items[i - 1])]
    cuts = [0]
    for j in range(1, parts):
        target = round(j * len(items) / parts)
        later = [c for c in cuts_at if c >= cuts[-1]]
        cuts.append(min(later, key=lambda c: abs(c - target)) if later else len(items))
    cuts.append(len(items))
    return [list(items[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]


def spread(long: Sequence[T], short: Sequence[T], workers: int,
           group: Callable[[T], Hashable]) -> list[T]:
    """The order of ``long`` and ``short`` tests (each in its collection order) for
    ``workers`` worksteal workers: the long ones at the start of the first ``workers - 1``
    shares (:func:`split_at_groups`), the short ones filling each share to its size
    (:func:`first_shares`) and the last share."""
    if workers <= 2 or not long:
        return [*long, *short]
    parts = split_at_groups(long, workers - 1, group)
    out: list[T] = []
    taken = 0
    for i, size in enumerate(first_shares(len(long) + len(short), workers)):
        head = parts[i] if i < len(parts) else []
        fill = max(0, size - len(head))
        out += [*head, *short[taken:taken + fill]]
        taken += fill
    out += short[taken:]
    return out
