"""The agent: one per process, the executor's (or front's) way to the tracker.

It holds the process's local tracker: ``add_acks`` and ``heartbeat`` are merged and
flushed by age or size in rule-2 order; ``send_batch`` carries a Spark task's output
under its rule-6 key and returns once the tracker has applied (and logged) it (the
calls every agent makes: :mod:`.base_agent`).

Threads: the public methods may be called from any thread. They hand work to a
background thread that runs the agent's own event loop; all state (local tracker,
connections, pending requests: :class:`~.agent_state.AgentState`) lives there, so it
needs no locks. Processes: the agent notices a fork (pid change) and starts afresh in
the child, with a new session; the parent keeps whatever it had in flight.
Connections are made lazily, in the background, and remade after any failure; every
unanswered request is then resent in order, and servers apply each one at most once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from lowtide.core.messages import AckBatch, Heartbeat, MinTimeUpdate
from lowtide.service.client.base_agent import BaseAgent
from lowtide.service.client.batches import Outcome
from lowtide.service.client.replies import timed
from lowtide.service.client.subscription import AsyncSubscription, Subscription

T = TypeVar("T")


async def _cancel_others() -> None:
    """Cancel every other task of the running loop and wait for them: a call another
    thread still waits on ends (its caller raises ConnectionLost) rather than be
    destroyed pending with the loop, its error never retrieved and its caller waiting
    for ever."""
    me = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not me]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


class Agent(BaseAgent):
    """An agent whose event loop always runs, on a thread of its own: besides the
    calls every agent makes, it buffers acks and heartbeats (flushed within
    ``max_age_ms``) and delivers subscriptions."""

    # ------------------------------------------------------------ its loop
    def _start_loop(self) -> None:
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="lowtide-agent", daemon=True
        )
        self._thread.start()
        self._loop.call_soon_threadsafe(self._state.start)

    def _running(self) -> bool:
        return self._thread.is_alive()

    def _stop_loop(self, timeout_s: float) -> None:
        asyncio.run_coroutine_threadsafe(self._state.close(), self._loop).result(timeout_s)
        asyncio.run_coroutine_threadsafe(_cancel_others(), self._loop).result(timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():  # an unclosed loop warns when it is collected
            self._loop.close()

    def _spawn(self, coro: Awaitable[T], timeout_s: float) -> Outcome[T]:
        if threading.current_thread() is self._thread:
            raise RuntimeError("blocking agent call on the agent's own thread (from a callback?)")
        return asyncio.run_coroutine_threadsafe(timed(coro, timeout_s), self._loop)

    # ------------------------------------------------------------ fire and forget
    def add_acks(self, acks: AckBatch) -> None:
        """Buffer acks in the local tracker; sent within ``max_age_ms``. Raises
        :class:`SessionFailed` once the tracker refused an earlier flush."""
        self._ensure()
        self._state.check_failed()
        self._loop.call_soon_threadsafe(self._state.add_acks, acks)

    def heartbeat(self, front: int, time: int, *, owner: str | None = None) -> None:
        """Buffer a heartbeat; it travels after every ack buffered before it (rule 3).
        ``owner``: as for :meth:`send_batch` (another owner's heartbeat is refused, and
        fails this agent's session). Raises :class:`SessionFailed` once the tracker
        refused an earlier flush."""
        self._ensure()
        self._state.check_failed()
        self._loop.call_soon_threadsafe(self._state.add_heartbeat, Heartbeat(front, time), owner)

    # ------------------------------------------------------------ subscriptions
    def subscribe(self, segment: str | None = None, timeout_s: float = 30.0) -> Subscription:
        """Blocking iterator of MinTimeUpdates (None: global), the current one first."""
        self._ensure()
        sub = Subscription(lambda: None)
        sub._cancel = self._start_subscription(segment, sub.put, timeout_s)
        return sub

    async def subscribe_async(self, segment: str | None = None) -> AsyncSubscription:
        """Like :meth:`subscribe`, as an asyncio iterator on the caller's loop."""
        self._ensure()
        sub = AsyncSubscription(lambda: None, asyncio.get_running_loop())
        fut = asyncio.run_coroutine_threadsafe(self._state.subscribe(segment, sub.put), self._loop)
        req = await asyncio.wrap_future(fut)
        sub._cancel = self._canceller(req)
        return sub

    def on_update(
        self, callback: Callable[[MinTimeUpdate], None], segment: str | None = None
    ) -> Callable[[], None]:
        """Call ``callback`` (on the agent's thread) with each update; returns a
        function that cancels the subscription."""
        self._ensure()
        return self._start_subscription(segment, callback, 30.0)

    def _start_subscription(
        self, segment: str | None, deliver: Callable[[MinTimeUpdate], None], timeout_s: float
    ) -> Callable[[], None]:
        if segment is not None:
            self.graph.resolve(segment)  # a segment, or a key range "<segment>#<r>"
        req = self._call(self._state.subscribe(segment, deliver), timeout_s)
        return self._canceller(req)

    def _canceller(self, req: int) -> Callable[[], None]:
        def cancel() -> None:
            if not self._loop.is_closed():  # a closed agent's subscriptions are gone
                self._loop.call_soon_threadsafe(self._state.unsubscribe, req)

        return cancel
