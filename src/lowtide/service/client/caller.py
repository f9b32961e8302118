"""An agent whose loop runs on the calling thread, during each call (Spark tasks)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Iterator
from typing import Generic, TypeVar

from lowtide.service.client.agent_state import timed
from lowtide.service.client.base_agent import BaseAgent
from lowtide.service.client.batches import Outcome

T = TypeVar("T")


class CallerAgent(BaseAgent):
    """An agent without a thread of its own: the calling thread runs its event loop,
    during each call. A round trip then wakes one thread (the caller) instead of two
    (the agent's thread, then the caller); on a loaded machine each wake-up may wait
    for a core, and a Spark task blocks on such a round trip before it ends (rule 6).
    Measured in one A/B run of ``lowtide bench spark``'s pipeline: 1.6 points of
    throughput. For processes that only make calls: keyed batches (:meth:`send_batch`,
    and :meth:`submit_batch`, whose request goes out at once), front operations,
    status and min-time queries, from one thread at a time (others wait), never from
    inside a running asyncio loop. Buffered acks, heartbeats and subscriptions need a
    loop that always runs: they are :class:`Agent`'s alone."""

    def _start_loop(self) -> None:
        self._lock = threading.Lock()
        self._together = False
        self._loop.call_soon(self._state.start)

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """Requests issued inside the block go out at its end, in one write (the
        server reads them at one wake-up and answers them in one write)."""
        self._together = True
        try:
            yield
        finally:
            self._together = False
            with self._lock:
                self._loop.run_until_complete(_turns(3))

    def _running(self) -> bool:
        return not self._loop.is_closed()

    def _stop_loop(self, timeout_s: float) -> None:
        with self._lock:
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(asyncio.wait_for(self._state.close(), timeout_s))
            self._loop.close()

    def _spawn(self, coro: Awaitable[T], timeout_s: float) -> Outcome[T]:
        with self._lock:
            task = self._loop.create_task(timed(coro, timeout_s))
            if not self._together:  # a few turns: a connected agent writes it now
                self._loop.run_until_complete(_turns(3))
        return _Driven(self._loop, self._lock, task)


class _Driven(Generic[T]):
    """A CallerAgent's call under way: :meth:`result` runs the loop until it is done."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, lock: threading.Lock, task: asyncio.Task[T]
    ) -> None:
        self._loop, self._lock, self._task = loop, lock, task

    def result(self) -> T:
        with self._lock:
            return self._loop.run_until_complete(self._task)


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)
