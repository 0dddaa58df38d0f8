"""A request's future (`batching.Pending`): concurrent.futures.Future's behaviour on a lighter
condition, for every way edged and its callers wait on one."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from edged.inference.batching import Pending


def later(action: object, delay_s: float = 0.05) -> threading.Timer:
    timer = threading.Timer(delay_s, action)  # type: ignore[arg-type]
    timer.start()
    return timer


def test_pending_when_set_from_another_thread_wakes_every_waiter() -> None:
    future = Pending()
    got: list[object] = []
    waiters = [threading.Thread(target=lambda: got.append(future.result(10)))
               for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    assert future.set_running_or_notify_cancel()
    later(lambda: future.set_result({"y": 1}))
    for waiter in waiters:
        waiter.join(10)
    assert got == [{"y": 1}] * 3 and future.done()


def test_pending_when_nothing_comes_times_out_and_stays_usable() -> None:
    future = Pending()
    with pytest.raises(concurrent.futures.TimeoutError):
        future.result(0.01)
    with pytest.raises(concurrent.futures.TimeoutError):
        future.exception(0)
    future.set_exception(RuntimeError("failed"))
    with pytest.raises(RuntimeError, match="failed"):
        future.result(1)


def test_pending_when_callbacks_and_cancel_behave_as_a_future() -> None:
    future = Pending()
    seen: list[Pending] = []
    future.add_done_callback(seen.append)
    assert future.cancel() and future.cancelled() and seen == [future]
    assert not future.set_running_or_notify_cancel()
    done = Pending()
    done.set_result({})
    done.add_done_callback(seen.append)  # at once
    assert seen == [future, done]


def test_pending_when_waited_on_by_concurrent_futures_wait_and_asyncio() -> None:
    futures = [Pending() for _ in range(3)]
    later(lambda: [f.set_result({"i": i}) for i, f in enumerate(futures)])
    done, _ = concurrent.futures.wait(futures, timeout=10)
    assert done == set(futures)
    first = Pending()
    later(lambda: first.set_result({"x": 2}))
    assert next(concurrent.futures.as_completed([first], timeout=10)) is first

    async def awaited() -> object:
        future = Pending()
        asyncio.get_running_loop().call_later(0.01, future.set_result, {"z": 3})
        return await asyncio.wrap_future(future)

    assert asyncio.run(awaited()) == {"z": 3}
