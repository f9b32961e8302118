"""An agent whose loop runs on the calling thread, during each call (Spark tasks)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import threading
from collections.abc import Awaitable, Callable
from typing import ClassVar, Generic, NoReturn, TypeVar

from lowtide.core.messages import AckBatch, MinTimeUpdate
from lowtide.core.time import TimeGrid
from lowtide.service.client.agent import Agent
from lowtide.service.client.agent_state import AgentState, timed
from lowtide.service.client.batches import Outcome
from lowtide.service.client.subscription import AsyncSubscription, Subscription

log = logging.getLogger("lowtide.service.agent")

T = TypeVar("T")


class CallerAgent(Agent):
    """An agent without a thread of its own: the calling thread runs its event loop,
    during each call. A round trip then wakes one thread (the caller) instead of two
    (the agent's thread, then the caller); on a loaded machine each wake-up may wait
    for a core, and a Spark task blocks on such a round trip before it ends (rule 6).
    Measured in one A/B run of ``lowtide bench spark``'s pipeline: 1.6 points of
    throughput. For processes that only make calls: keyed batches (:meth:`send_batch`,
    and :meth:`submit_batch`, whose request goes out at once), front operations,
    status and min-time queries, from one thread at a time (others wait), never from
    inside a running asyncio loop. Buffered acks, heartbeats and subscriptions need a
    loop that always runs: they are refused here (use :class:`Agent`)."""

    _shared: ClassVar[dict[tuple[str, str, TimeGrid | None], Agent]] = {}

    def _boot(self) -> None:
        self._pid = os.getpid()
        self.session = secrets.randbits(62) + 1
        self._loop = asyncio.new_event_loop()
        self._state = AgentState(self, self.session)
        self._thread = None  # type: ignore[assignment]
        self._lock = threading.Lock()
        self._loop.call_soon(self._state.start)

    def _spawn(self, coro: Awaitable[T], timeout_s: float) -> Outcome[T]:
        with self._lock:
            task = self._loop.create_task(timed(coro, timeout_s))
            # a few turns of the loop: a connected agent writes the request now
            self._loop.run_until_complete(_turns(3))
        return _Driven(self._loop, self._lock, task)

    def close(self, timeout_s: float = 5.0) -> None:
        if os.getpid() != self._pid or self._loop.is_closed():
            return
        try:
            self._call(self._state.flush_all(), timeout_s)
        except Exception as exc:  # closing must not fail
            log.warning("close: unflushed acks", extra={"url": self.url, "reason": repr(exc)})
        with self._lock:
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(asyncio.wait_for(self._state.close(), timeout_s))
            self._loop.close()
        self._forget()

    def _refuse(self, what: str) -> NoReturn:
        raise RuntimeError(f"{what} needs an agent whose loop always runs: use Agent, "
                           "not CallerAgent (it runs only during calls)")

    def add_acks(self, acks: AckBatch) -> None:
        self._refuse("add_acks")

    def heartbeat(self, front: int, time: int, *, owner: str | None = None) -> None:
        self._refuse("heartbeat")

    def subscribe(self, segment: str | None = None, timeout_s: float = 30.0) -> Subscription:
        self._refuse("subscribe")

    async def subscribe_async(self, segment: str | None = None) -> AsyncSubscription:
        self._refuse("subscribe_async")

    def on_update(
        self, callback: Callable[[MinTimeUpdate], None], segment: str | None = None
    ) -> Callable[[], None]:
        self._refuse("on_update")


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
