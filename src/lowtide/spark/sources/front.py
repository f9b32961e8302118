"""``lowtide.Front``: a producer that labels events with global time at ingestion.

``Front.send(payloads)`` does, under one lock:

1. label the records with the current slot (never below the previous label);
2. hand their send-acks to the agent (segment: the ingest segment, values
   ``root_acks(front, offset)``);
3. append them to the front's ingest log (durably with ``fsync="always"``).

A background thread heartbeats every ``heartbeat_ms`` with the current slot, on the
same agent channel as the acks and after them (rule 3), so an idle front never holds
completeness back. The Spark source (:mod:`lowtide.spark.sources.log_source`) reads the log and
acks receipt.

Acks are handed to the agent *before* the append. With ``confirm=True`` ``send`` waits
for the tracker to confirm them first: if the process dies between the two, the
tracker reports the records as missing in the ingest segment (they are). With the
default ``confirm=False`` the agent buffers them for at most ``max_age_ms`` (5 ms): a
crash inside that window shows the logged records as extra items in the ingest segment
once Spark reads them. Safety holds either way: a heartbeat never travels ahead of the
acks it covers.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import numpy as np

from lowtide.core.acks import root_acks
from lowtide.core.messages import AckBatch
from lowtide.core.time import Clock, TimeGrid
from lowtide.service.clock import SystemClock
from lowtide.spark.sources.ingest import IngestWriter
from lowtide.spark.tracking.transport import AgentLike, TrackerRef, connect

#: The owner name fronts register with: a restarted producer of a front is its
#: successor (see ``Agent.register_front``).
OWNER = "lowtide-front"


class Front:
    """One front: labels, acks and logs events; heartbeats while idle.

    ``tracker`` is a :class:`TrackerRef` or an agent; ``segment`` is the ingest segment
    the front feeds (the source segment of the pipeline, by default ``"ingest"``).
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        front: int,
        tracker: TrackerRef | AgentLike,
        *,
        segment: str = "ingest",
        grid: TimeGrid | None = None,
        clock: Clock | None = None,
        fsync: str = "always",
        heartbeat_ms: int | None = 20,
        confirm: bool = False,
    ) -> None:
        if isinstance(tracker, TrackerRef):
            self._agent = connect(tracker)
            self.grid = grid or tracker.grid
            self._segment_index = tracker.graph.index(segment)
        else:
            self._agent = tracker
            self.grid = grid or TimeGrid()
            self._segment_index = None
        self.front = front
        self.segment = segment
        self.confirm = confirm
        self._clock = clock or SystemClock()
        self._writer = IngestWriter(log_dir, front, fsync=fsync)
        self._lock = threading.Lock()
        self._last_slot = max(self._writer.last_time, self._now_slot())
        self._closed = False
        self._agent.register_front(front, segment, self._last_slot, owner=OWNER)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if heartbeat_ms:
            self._thread = threading.Thread(
                target=self._beat, args=(heartbeat_ms / 1000,), daemon=True,
                name=f"lowtide-front-{front}",
            )
            self._thread.start()

    @property
    def end_offset(self) -> int:
        return self._writer.end_offset

    def _now_slot(self) -> int:
        return self.grid.slot_of(self._clock.now_ms())

    def _segment(self) -> int:
        if self._segment_index is None:
            graph = getattr(self._agent, "graph", None)
            if graph is None:
                raise TypeError("pass a TrackerRef, or an agent with a .graph")
            self._segment_index = graph.index(self.segment)
        return self._segment_index

    def send(self, payloads: Sequence[bytes] | bytes) -> int:
        """Ingest records; returns the first one's offset in the front's log."""
        if isinstance(payloads, bytes | bytearray):
            payloads = [bytes(payloads)]
        n = len(payloads)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"front {self.front} is closed")
            slot = max(self._now_slot(), self._last_slot)
            first = self._writer.end_offset
            if n:
                acks = root_acks(self.front, np.arange(first, first + n, dtype=np.uint64))
                xor = np.bitwise_xor.reduce(acks)
                self._agent.add_acks(
                    AckBatch.from_columns(self._segment(), [slot], [xor], [n])
                )
                if self.confirm:
                    self.flush()
                self._writer.append(payloads, slot)
            self._last_slot = slot
            return first

    def flush(self) -> None:
        """Wait until the tracker confirmed every ack and heartbeat sent so far; raises
        what it refused."""
        flush = getattr(self._agent, "flush", None)
        if flush is not None:
            flush()

    def heartbeat(self) -> int:
        """Promise: no record with a slot below the returned one will follow."""
        with self._lock:
            if self._closed:
                return self._last_slot
            slot = max(self._now_slot(), self._last_slot)
            self._last_slot = slot
            self._agent.heartbeat(self.front, slot)
            return slot

    def _beat(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self.heartbeat()
            except Exception:  # keep beating through transient agent errors
                continue

    def close(self, *, unregister: bool = False) -> int:
        """Send a last heartbeat, stop heartbeating and close the log; returns the last
        heartbeat. ``unregister=True`` tells the tracker the front is done (it then no
        longer holds its segment back)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._closed:
                return self._last_slot
            self._last_slot = max(self._now_slot(), self._last_slot)
            self._agent.heartbeat(self.front, self._last_slot)
            self._closed = True
            self._writer.close()
        if unregister:
            unreg = getattr(self._agent, "unregister_front", None)
            if unreg is not None:
                unreg(self.front, owner=OWNER)
        return self._last_slot

    def __enter__(self) -> Front:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
