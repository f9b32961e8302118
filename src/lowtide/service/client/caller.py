"""An agent whose loop runs on the calling thread, during each call (Spark tasks)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Generic, TypeVar

from lowtide.core.messages import AckBatch, Heartbeat
from lowtide.service.client.base_agent import BaseAgent
from lowtide.service.client.batches import BatchKey, Outcome
from lowtide.service.client.connection import Reply
from lowtide.service.client.replies import applied, no_answer, time_of, timed

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

    #: :meth:`shared` closes this process's agents unused for this long when it makes
    #: another: a Spark worker outlives the pipelines whose tasks it runs, and each
    #: tracker's agent (a loop, its state: some 1,500 objects that every task's
    #: garbage collection walks) would stay for ever
    IDLE_S = 60.0

    def _start_loop(self) -> None:
        self._lock = threading.Lock()
        self._together = False
        self._used_s = time.monotonic()
        self._loop.call_soon(self._state.start)

    def _stale(self) -> bool:
        return time.monotonic() - self._used_s > self.IDLE_S

    def _flush_before_close(self, timeout_s: float) -> None:
        """Nothing to flush: a CallerAgent buffers nothing, and its callers waited for
        their replies (a flush would wait for a gone tracker's Welcome)."""

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
            self._used_s = time.monotonic()
            task = self._loop.create_task(timed(coro, timeout_s))
            if not self._together:  # a few turns: a connected agent writes it now
                self._loop.run_until_complete(_turns(3))
        return _Driven(self._loop, self._lock, task)

    # A task's keyed batch and its stamp's question, once the agent is ready: written
    # by the calling thread itself, no task and no turn of the loop to send them; the
    # loop runs only while the caller waits for the replies. Measured: submit and wait
    # 400-480 -> 290-340 us of the calling thread's CPU (a client microbench).
    def _send_keyed(self, key: BatchKey, acks: AckBatch, hbs: tuple[Heartbeat, ...],
                    owner: str | None, timeout_s: float) -> Outcome[bool]:
        sent = self._sent(lambda now: self._state.send_keyed(key, acks, hbs, owner, now),
                          applied, timeout_s)
        return sent if sent is not None else super()._send_keyed(key, acks, hbs, owner,
                                                                  timeout_s)

    def _ask_min_time(self, segment: str | None, at_ms: int, timeout_s: float) -> Outcome[int]:
        sent = self._sent(lambda now: [self._state.ask_min_time(segment, at_ms, now)],
                          lambda replies: time_of(replies[0]), timeout_s)
        return sent if sent is not None else super()._ask_min_time(segment, at_ms, timeout_s)

    def _sent(self, send: Callable[[bool], list[asyncio.Future[Reply]]],
              read: Callable[[list[Reply]], T], timeout_s: float) -> _Answered[T] | None:
        """``send(now)``'s requests, sent, if the agent is ready (None: not yet)."""
        with self._lock:
            self._used_s = time.monotonic()
            if not self._state.ready.is_set():
                return None
            futs = send(not self._together)  # in a together() block: at its end
            return _Answered(self._loop, self._lock, futs, read, timeout_s)


class _Driven(Generic[T]):
    """A CallerAgent's call under way: :meth:`result` runs the loop until it is done."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, lock: threading.Lock, task: asyncio.Task[T]
    ) -> None:
        self._loop, self._lock, self._task = loop, lock, task

    def result(self) -> T:
        with self._lock:
            return self._loop.run_until_complete(self._task)


class _Answered(Generic[T]):
    """A CallerAgent's requests, sent: :meth:`result` runs the loop until their replies
    came (at most ``timeout_s`` from when they were sent), then reads them."""

    def __init__(self, loop: asyncio.AbstractEventLoop, lock: threading.Lock,
                 futs: list[asyncio.Future[Reply]], read: Callable[[list[Reply]], T],
                 timeout_s: float) -> None:
        self._loop, self._lock, self._futs, self._read = loop, lock, futs, read
        self._timeout_s = timeout_s
        self._deadline = loop.time() + timeout_s

    def result(self) -> T:
        futs = self._futs
        with self._lock:
            # several (shards): every reply retrieved, the first refusal raised below
            last = futs[0] if len(futs) == 1 else asyncio.gather(*futs, return_exceptions=True)
            if not last.done():
                timer = self._loop.call_at(self._deadline, _expire, futs, self._timeout_s)
                try:
                    self._loop.run_until_complete(last)
                finally:
                    timer.cancel()
        return self._read([fut.result() for fut in futs])


def _expire(futs: list[asyncio.Future[Reply]], timeout_s: float) -> None:
    for fut in futs:
        if not fut.done():
            fut.set_exception(no_answer(timeout_s))


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)
