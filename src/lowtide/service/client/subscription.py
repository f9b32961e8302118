"""Client-side subscriptions: a blocking iterator, an asyncio iterator, a callback.

Each delivers MinTimeUpdates of one segment (or the global min) in order, starting
with the current one. After a reconnect the server sends the current min time again;
only updates that move forward are passed on, so a subscriber never sees one twice.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable, Iterator

from lowtide.core.messages import MinTimeUpdate

Deliver = Callable[[MinTimeUpdate], None]


class Forward:
    """Drops updates that do not move forward, then delivers (in the agent's loop)."""

    def __init__(self, deliver: Deliver) -> None:
        self._deliver = deliver
        self.last: int | None = None

    def __call__(self, update: MinTimeUpdate) -> None:
        if self.last is None or update.time > self.last:
            self.last = update.time
            self._deliver(update)


class _Handle:
    def __init__(self, cancel: Callable[[], None]) -> None:
        self._cancel = cancel
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._cancel()


class Subscription(_Handle):
    """Blocking iterator; ``next_update(timeout_s)`` for a bounded wait."""

    def __init__(self, cancel: Callable[[], None]) -> None:
        super().__init__(cancel)
        self._queue: queue.SimpleQueue[MinTimeUpdate] = queue.SimpleQueue()

    def put(self, update: MinTimeUpdate) -> None:
        self._queue.put(update)

    def next_update(self, timeout_s: float | None = None) -> MinTimeUpdate:
        """The next update; raises TimeoutError if none comes within ``timeout_s``."""
        try:
            return self._queue.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no min time update within {timeout_s} s") from None

    def wait_for(self, time: int, timeout_s: float) -> MinTimeUpdate:
        """Consume updates until one reaches ``time``."""
        while True:
            update = self.next_update(timeout_s)
            if update.time >= time:
                return update

    def __iter__(self) -> Iterator[MinTimeUpdate]:
        return self

    def __next__(self) -> MinTimeUpdate:
        return self._queue.get()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSubscription(_Handle):
    """``async for update in agent.subscribe_async(...)``, on the caller's loop."""

    def __init__(self, cancel: Callable[[], None], loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(cancel)
        self._loop = loop
        self._queue: asyncio.Queue[MinTimeUpdate] = asyncio.Queue()

    def put(self, update: MinTimeUpdate) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, update)

    def __aiter__(self) -> AsyncIterator[MinTimeUpdate]:
        return self

    async def __anext__(self) -> MinTimeUpdate:
        return await self._queue.get()
