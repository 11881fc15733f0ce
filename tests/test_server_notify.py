"""Long-poll wake-ups (server_app.notify.Changes): a waiter on the event loop is woken by a
notify from a worker thread, and a generation that moved on before it waits returns at once."""

from __future__ import annotations

import asyncio
import threading

from server_app.notify import Changes


def test_event_loop_waiter_woken_by_a_notify_from_another_thread() -> None:
    changes = Changes(threading.RLock())

    async def scenario() -> tuple[bool, int]:
        gen = changes.generation
        waiter = asyncio.ensure_future(changes.wait_async(gen, 30.0))
        await asyncio.sleep(0.05)
        pending = not waiter.done()
        changes.touch("job")
        t = threading.Thread(target=changes.notify, args=("job",))
        t.start()
        await asyncio.wait_for(waiter, 10.0)  # woken long before its 30 s timeout
        t.join()
        return pending, changes.generation - gen

    pending, moved = asyncio.run(scenario())
    assert pending and moved == 1


def test_notify_without_touch_wakes_nobody_and_stale_generation_returns_at_once() -> None:
    changes = Changes(threading.RLock())

    async def scenario() -> tuple[bool, bool]:
        gen = changes.generation
        waiter = asyncio.ensure_future(changes.wait_async(gen, 30.0))
        await asyncio.sleep(0.05)
        changes.notify("job")  # nothing touched: no wake-up
        await asyncio.sleep(0.05)
        still_waiting = not waiter.done()
        changes.notify()  # a global notify wakes it
        await asyncio.wait_for(waiter, 10.0)
        # a generation that already moved on: no wait at all
        await asyncio.wait_for(changes.wait_async(gen, 30.0), 1.0)
        return still_waiting, True

    assert asyncio.run(scenario()) == (True, True)


def test_wait_async_times_out() -> None:
    changes = Changes(threading.RLock())
    asyncio.run(asyncio.wait_for(changes.wait_async(changes.generation, 0.05), 10.0))
    assert changes.generation == 0
