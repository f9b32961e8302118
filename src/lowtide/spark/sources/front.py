"""``lowtide.Front``: where records enter a tracked pipeline and get their global time.

A front labels records (the contract: :mod:`lowtide.spark.sources.labels`), hands
their send-acks to the tracker's agent, and promises by heartbeats that no record
below a time will follow. No pyspark: a plain producer process imports it.

Two ways to use it:

* ``Front(log_dir, front, tracker).send(payloads)`` writes the records to the front's
  own ingest log (:mod:`lowtide.spark.sources.ingest`), read by the ``lowtide_log``
  Spark source;
* ``Front(None, front, tracker)`` for a producer that writes elsewhere:
  ``batch = front.label(records)`` (a list of bytes, a pyarrow table or a pandas
  DataFrame) returns the records with ``lt_time``/``lt_ack`` after their send-acks
  were handed to the agent; the producer writes ``batch.records`` and calls
  ``front.written(batch)`` once the write is confirmed. The helpers in
  :mod:`~lowtide.spark.sources.kafka_producer` and
  :mod:`~lowtide.spark.sources.files_producer` do both.

Heartbeats (a background thread every ``heartbeat_ms``, on the agent channel that
carried the acks, after them: rule 3) never pass a batch that was labelled but not
confirmed written: the front's promise means "everything below is written". A batch
whose write failed for good stays in flight, so the ingest segment stops there and the
tracker reports its records as missing (fail closed).

Acks go to the agent *before* the records are handed back. With ``confirm=True``
:meth:`label` waits for the tracker to confirm them: a producer killed between label and
write then shows as missing records in the ingest segment. With ``confirm=False`` the
agent buffers them for at most ``max_age_ms``: a crash inside that window shows written
records as extra items once they are read. Either way no min time passes them.

Event time (``time_from="ts"``): records are labelled from their own column instead of
the clock (:mod:`~lowtide.spark.sources.lateness` for the late policies). Several
consumers (``segment=("ingest_a", "ingest_b")``): each record is one copy per consumer
segment, sent into each; the front registers there as ``front + k * CONSUMER_STRIDE``.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from lowtide.core.acks import root_acks
from lowtide.core.time import Clock, TimeGrid
from lowtide.service.clock import SystemClock
from lowtide.spark.sources import records as rec
from lowtide.spark.sources.event_time import event_time_of
from lowtide.spark.sources.ingest import IngestWriter
from lowtide.spark.sources.labels import as_label
from lowtide.spark.sources.lateness import LatePolicy, LateStats
from lowtide.spark.sources.retention import retain
from lowtide.spark.tracking.column import AckAccumulator
from lowtide.spark.tracking.transport import AgentLike, TrackerRef, connect

__all__ = ["CONSUMER_STRIDE", "OWNER", "Front", "Labelled"]

#: The owner name fronts register with: a restarted producer of a front is its
#: successor (see ``Agent.register_front``).
OWNER = "lowtide-front"
#: Front ids of one front's registrations on its 2nd, 3rd, ... consumer segment.
CONSUMER_STRIDE = 1 << 32
# A front with no log numbers its records from its start time, so a restarted
# producer does not reuse the ack values of its previous run.
SEQ_PER_MS = 1 << 20


@dataclass(frozen=True)
class Labelled:
    """One labelled batch: ``records`` to write (label columns attached to tables), the
    labels, and what the late policy returned to the producer (``late="reject"``)."""

    records: Any
    times: npt.NDArray[np.int64]
    acks: npt.NDArray[np.int64]
    first_seq: int
    rejected: Any = None
    token: int = 0

    def __len__(self) -> int:
        return len(self.times)


class Front:
    """One front: labels and acks records, heartbeats; see the module docstring.

    ``tracker`` is a :class:`TrackerRef` or an agent; ``segment`` the ingest segment
    (or segments, one per consumer) of the pipeline; ``lag_ms`` (event time only): how
    far behind its newest event time the front promises, i.e. how much disorder is
    labelled as is rather than handled as late; ``rotate_bytes``: the size of one file
    of the ingest log (files every consumer committed are deleted at each rotation).
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None,
        front: int,
        tracker: TrackerRef | AgentLike,
        *,
        segment: str | Sequence[str] = "ingest",
        grid: TimeGrid | None = None,
        clock: Clock | None = None,
        fsync: str = "always",
        heartbeat_ms: int | None = 20,
        confirm: bool = False,
        time_from: str | None = None,
        time_format: str | None = None,
        late: str = "clamp",
        lag_ms: int = 0,
        start_ms: int | None = None,
        rotate_bytes: int | None = 64 << 20,
    ) -> None:
        self.segments = (segment,) if isinstance(segment, str) else tuple(segment)
        if not self.segments:
            raise ValueError("a front feeds at least one segment")
        self.segment = self.segments[0]
        self.front = front
        self.confirm = confirm
        self.time_from = event_time_of(time_from, time_format)
        self._connect(tracker, grid)
        self._clock = clock or SystemClock()
        self._late = LatePolicy(late, self.grid.slot_of(lag_ms) if lag_ms else 0)
        self.late_stats = LateStats()
        self._writer = None if log_dir is None else self._open_log(log_dir, fsync, rotate_bytes)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # one log writer: label order is log order
        self._tokens = itertools.count(1)
        self._in_flight: dict[int, tuple[int, int]] = {}  # token -> (min time, records)
        self._next_seq = (self._writer.end_offset if self._writer is not None
                          else self._clock.now_ms() * SEQ_PER_MS)
        self._max_label = -1
        self._last_beat = -1
        self._closed = False
        if time_from is None:
            last = self._writer.last_time if self._writer is not None else -1
            self._register(max(last, self._now_slot()))
        elif start_ms is not None:
            self._register(self.grid.slot_of(start_ms))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if heartbeat_ms:
            self._thread = threading.Thread(
                target=self._beat, args=(heartbeat_ms / 1000,), daemon=True,
                name=f"lowtide-front-{front}",
            )
            self._thread.start()

    def _connect(self, tracker: TrackerRef | AgentLike, grid: TimeGrid | None) -> None:
        if isinstance(tracker, TrackerRef):
            self._agent, self.grid = connect(tracker), grid or tracker.grid
        else:
            self._agent, self.grid = tracker, grid or TimeGrid()
        graph = tracker.graph if isinstance(tracker, TrackerRef) else getattr(
            tracker, "graph", None)
        if graph is None:
            raise TypeError("pass a TrackerRef, or an agent with a .graph")
        self._segment_index = [graph.index(s) for s in self.segments]

    def _open_log(self, log_dir: str | os.PathLike[str], fsync: str,
                  rotate_bytes: int | None) -> IngestWriter:
        if self.time_from is not None:
            raise ValueError("the ingest log keeps each front's times non-decreasing: "
                             "with time_from, pass log_dir=None and write elsewhere")
        return IngestWriter(log_dir, self.front, fsync=fsync, rotate_bytes=rotate_bytes,
                            on_rotate=lambda: retain(log_dir))

    # -- registration and time ------------------------------------------------------

    def front_ids(self) -> list[int]:
        """This front's id on each of its segments."""
        return [self.front + k * CONSUMER_STRIDE for k in range(len(self.segments))]

    def _register(self, slot: int) -> None:
        for fid, segment in zip(self.front_ids(), self.segments, strict=True):
            self._agent.register_front(fid, segment, slot, owner=OWNER)
        self._last_beat = slot

    @property
    def registered(self) -> bool:
        return self._last_beat >= 0

    @property
    def end_offset(self) -> int:
        """The next record's sequence number (its offset in the front's log)."""
        return self._next_seq

    def _now_slot(self) -> int:
        return self.grid.slot_of(self._clock.now_ms())

    def _current_slot(self) -> int:
        """Where the front stands: its clock, or (event time) its newest label minus
        the allowed lag."""
        if self.time_from is None:
            return self._now_slot()
        return self._max_label - self._late.lag_slots

    def _promise(self, current: int) -> int:
        """The heartbeat the front may send: never past a batch not yet written."""
        if self._in_flight:
            current = min(current, min(t for t, _n in self._in_flight.values()))
        return max(self._last_beat, current)

    # -- labelling ------------------------------------------------------------------

    def label(self, records: Any) -> Labelled:
        """Label ``records`` and hand their send-acks to the tracker; write
        ``.records`` and then call :meth:`written`. Raises :class:`LateRecords` (and
        labels nothing) under ``late="raise"``."""
        if self._writer is not None:
            raise ValueError("this front writes its own ingest log: use send()")
        with self._lock:
            return self._label(records)

    def _label(self, records: Any) -> Labelled:
        if self._closed:
            raise RuntimeError(f"front {self.front} is closed")
        n = rec.count(records)
        if self.time_from is None:
            times = np.full(n, max(self._now_slot(), self._max_label, self._last_beat),
                            np.int64)
            keep, rejected = records, None
        else:
            slots = rec.event_times_ms(records, self.time_from) // self.grid.delta_ms
            if not self.registered and n:  # the first batch says where event time starts
                self._register(max(int(slots.min()) - self._late.lag_slots, 0))
            times, kept = self._late.apply(slots, self._last_beat, self.late_stats)
            keep = records if kept is None else rec.take(records, kept)
            rejected = None if kept is None else rec.take(
                records, np.setdiff1d(np.arange(n), kept))
        k = len(times)
        seq = np.arange(self._next_seq, self._next_seq + k, dtype=np.uint64)
        acks = root_acks(self.front, seq)
        if k:
            acc = AckAccumulator()
            for index in self._segment_index:
                acc.add(index, times, acks, +1)
            self._agent.add_acks(acc.build(self.grid.window_slots))
            if self.confirm:
                self.flush()
            self._max_label = max(self._max_label, int(times.max()))
        token = next(self._tokens)
        self._in_flight[token] = (int(times.min()) if k else self._last_beat, k)
        labels = as_label(acks)
        batch = Labelled(rec.with_labels(keep, times, labels), times, labels,
                         self._next_seq, rejected, token)
        self._next_seq += k
        self.late_stats.labelled += k
        return batch

    def written(self, batch: Labelled) -> None:
        """The producer's write of ``batch`` is confirmed: heartbeats may pass it."""
        with self._lock:
            if self._in_flight.pop(batch.token, None) is not None:
                self.late_stats.written += len(batch)

    def send(self, payloads: Sequence[bytes] | bytes) -> int:
        """Ingest records into the front's log; returns the first one's offset."""
        if self._writer is None:
            raise ValueError("this front has no ingest log: label() and write the records")
        if isinstance(payloads, bytes | bytearray):
            payloads = [bytes(payloads)]
        if rec.kind(list(payloads)) != "bytes":
            raise TypeError("the ingest log stores bytes payloads")
        with self._send_lock:
            with self._lock:
                batch = self._label(list(payloads))
            self._writer.append(batch.records, batch.times)
            self.written(batch)
        return batch.first_seq

    # -- heartbeats -----------------------------------------------------------------

    def flush(self) -> None:
        """Wait until the tracker confirmed every ack and heartbeat sent so far; raises
        what it refused."""
        flush = getattr(self._agent, "flush", None)
        if flush is not None:
            flush()

    def _send_beat(self, slot: int) -> int:
        for fid in self.front_ids():
            self._agent.heartbeat(fid, slot)
        self._last_beat = slot
        return slot

    def heartbeat(self) -> int:
        """Promise: no record with a slot below the returned one will follow."""
        with self._lock:
            if self._closed or not self.registered:
                return self._last_beat
            return self._send_beat(self._promise(self._current_slot()))

    def _beat(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self.heartbeat()
            except Exception:  # keep beating through transient agent errors
                continue

    def status(self) -> dict[str, Any]:
        """Counts and times of this front (for logs, status pages and metrics)."""
        with self._lock:
            in_flight = sum(n for _t, n in self._in_flight.values())
            return {"front": self.front, "segments": list(self.segments),
                    "last_heartbeat": self._last_beat, "max_label": self._max_label,
                    "in_flight": in_flight, **self.late_stats.as_dict()}

    def close(self, *, unregister: bool = False) -> int:
        """Send a last heartbeat, stop heartbeating and close the log; returns the last
        heartbeat. An event-time front promises past its newest label (nothing more
        follows). ``unregister=True`` tells the tracker the front is done (it then no
        longer holds its segment back)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._closed:
                return self._last_beat
            if self.registered:
                done = self._max_label + 1 if self.time_from else self._now_slot()
                self._send_beat(self._promise(done))
            self._closed = True
            if self._writer is not None:
                self._writer.close()
        if unregister and self.registered:
            unreg = getattr(self._agent, "unregister_front", None)
            if unreg is not None:
                for fid in self.front_ids():
                    unreg(fid, owner=OWNER)
        return self._last_beat

    def __enter__(self) -> Front:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
