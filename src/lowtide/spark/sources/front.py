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

Acks go to the agent *before* the records are handed back. By default (``confirm=True``,
durable send-acks) :meth:`label` and :meth:`send` return only once the tracker has
confirmed (and logged) them: a record that reaches the log or topic is always covered by
acks the tracker has, whatever happens to the producer afterwards (a crash, an exit
while the tracker is down). A producer killed between label and write shows as
missing records in the ingest segment. ``confirm=False`` saves that round trip per
batch (docs/spark.md prices it): the agent buffers the acks for at most ``max_age_ms``,
and a producer that dies in that window, or exits while the tracker is unreachable,
leaves written records without send-acks; its successor's heartbeats then let min
times pass them. Use it only where the records can be produced again.

The owner: :mod:`lowtide.spark.sources.front_owner`.

Range check. Event times more than ``max_ahead_ms`` ahead of the front's clock (a unit
mix-up) or before the epoch are found in :meth:`label`, before any ack is sent: refused
with the batch under ``late="raise"``, else returned in ``Labelled.rejected`` and
counted in ``out_of_range``; they never get a label the tracker would refuse.

Event time (``time_from="ts"``): records are labelled from their own column instead of
the clock (:mod:`~lowtide.spark.sources.lateness` for the late policies). Several
consumers (``segment=("ingest_a", "ingest_b")``): each record is one copy per consumer
segment, sent into each; the front registers there as ``front + k * CONSUMER_STRIDE``.
A front with an ingest log also joins a consumer attached to its log while it runs,
and leaves a detached one (:mod:`~lowtide.spark.sources.front_feeds`); so does a front
without one given ``joins_dir``, a directory it shares with the queries of its Kafka
topic (``Pipeline.read_stream(..., joins_dir=)``).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time as _time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from lowtide.core.acks import root_acks
from lowtide.core.errors import LowtideError
from lowtide.core.time import Clock, TimeGrid
from lowtide.service.clock import SystemClock
from lowtide.spark.sources import records as rec
from lowtide.spark.sources.event_time import event_time_of
from lowtide.spark.sources.front_agent import FrontAgent
from lowtide.spark.sources.front_feeds import CONSUMER_STRIDE, Feeds, FrontEnded
from lowtide.spark.sources.front_owner import default_owner, register_when_free
from lowtide.spark.sources.ingest import IngestWriter
from lowtide.spark.sources.labels import Labelled, as_label
from lowtide.spark.sources.lateness import LatePolicy, LateStats
from lowtide.spark.sources.retention import retain
from lowtide.spark.tracking.column import AckAccumulator
from lowtide.spark.tracking.transport import TrackerRef, connect

log = logging.getLogger("lowtide.spark.front")

__all__ = ["CONSUMER_STRIDE", "Front", "FrontEnded", "Labelled", "default_owner",
           "register_when_free"]

# A front with no log numbers its records from its start time, so a restarted
# producer does not reuse the ack values of its previous run.
SEQ_PER_MS = 1 << 20
#: how far ahead of its clock an event time may be (a unit mix-up is years ahead); well
#: inside a default tracker's window (2**20 windows of 10 ms: 2.9 hours)
MAX_AHEAD_MS = 3_600_000


#: how often a front repeats its late counts to the tracker while they do not change
LATE_REPORT_EVERY_S = 5.0
#: how often a log front looks for consumers that joined or left its log
FOLLOW_EVERY_S = 0.2

class Front:
    """One front: labels and acks records, heartbeats; see the module docstring.

    ``tracker`` is a :class:`TrackerRef` or an agent; ``segment`` the ingest segment
    (or segments, one per consumer) of the pipeline; ``lag_ms`` (event time only): how
    far behind its newest event time the front promises, i.e. how much disorder is
    labelled as is rather than handled as late; ``rotate_bytes``: the size of one file
    of the ingest log (files every consumer committed are deleted at each rotation);
    ``owner``: who the front belongs to (see the module docstring; default
    :func:`default_owner`); ``confirm``: durable send-acks (see the module docstring);
    ``max_ahead_ms``: the range check of event times (None: no clock check);
    ``start_ms`` (event time): register at this time now, instead of at the first
    batch's earliest time (records below it are late); ``confirm_timeout_s``: how long
    :meth:`label` waits for the tracker's confirmation (then TimeoutError: do not write
    the batch, its records show as missing); ``joins_dir`` (no ingest log): a directory
    shared with the queries of the front's topic, through which it joins a query
    attached while it runs (see the module docstring).
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None,
        front: int,
        tracker: TrackerRef | FrontAgent,
        *,
        segment: str | Sequence[str] = "ingest",
        grid: TimeGrid | None = None,
        clock: Clock | None = None,
        fsync: str = "always",
        heartbeat_ms: int | None = 20,
        confirm: bool = True,
        time_from: str | None = None,
        time_format: str | None = None,
        late: str = "clamp",
        lag_ms: int = 0,
        start_ms: int | None = None,
        rotate_bytes: int | None = 64 << 20,
        owner: str | None = None,
        max_ahead_ms: int | None = MAX_AHEAD_MS,
        confirm_timeout_s: float = 30.0,
        joins_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        segments = (segment,) if isinstance(segment, str) else tuple(segment)
        if not segments:
            raise ValueError("a front feeds at least one segment")
        self.segment = segments[0]
        self.front = front
        self.confirm = confirm
        self.confirm_timeout_s = confirm_timeout_s
        self.time_from = event_time_of(time_from, time_format)
        self.owner = owner or default_owner(log_dir)
        if max_ahead_ms is not None and max_ahead_ms < 0:
            raise ValueError("max_ahead_ms must be >= 0 (None: no clock check)")
        if log_dir is not None and joins_dir is not None:
            raise ValueError("a front with an ingest log follows joins in its log "
                             "directory: pass joins_dir only with log_dir=None")
        self._connect(tracker, grid, segments, log_dir if log_dir is not None else joins_dir)
        self._ahead_slots = None if max_ahead_ms is None else self.grid.slot_of(max_ahead_ms)
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
        self._late_sent, self._late_due = (0, 0, 0, 0), 0.0  # the last late report
        self._closed = False
        self._follow_due, self._follow_error = 0.0, ""
        self._skew_slots = 0  # a clock front's clock behind where it registered
        last = self._writer.last_time if self._writer is not None else -1
        start = max(last, self._now_slot())
        self._feeds.answer_given(self._next_seq, start)
        if time_from is None:
            self._register(start)
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

    def _connect(self, tracker: TrackerRef | FrontAgent, grid: TimeGrid | None,
                 segments: tuple[str, ...], joins_dir: str | os.PathLike[str] | None) -> None:
        if isinstance(tracker, TrackerRef):  # its agent's handshake checks the grid
            # a service Agent, or the stand-in registered for the ref's scheme
            self._agent = cast(FrontAgent, connect(tracker))
            self.grid, graph = grid or tracker.grid, tracker.graph
        else:  # the tracker's grid, as the agent's handshake learnt it
            self._agent, told, graph = tracker, tracker.grid, tracker.graph
            if grid is not None and grid != told:
                raise ValueError(f"grid {grid} is not the tracker's {told}: label with "
                                 "the tracker's grid (pass none to use it)")
            self.grid = told
        self._feeds = Feeds(self.front, self._agent, graph, segments, joins_dir)

    def _open_log(self, log_dir: str | os.PathLike[str], fsync: str,
                  rotate_bytes: int | None) -> IngestWriter:
        if self.time_from is not None:
            raise ValueError("the ingest log keeps each front's times non-decreasing: "
                             "with time_from, pass log_dir=None and write elsewhere")
        return IngestWriter(log_dir, self.front, fsync=fsync, rotate_bytes=rotate_bytes,
                            on_rotate=lambda: retain(log_dir))

    # -- registration and time ------------------------------------------------------

    @property
    def segments(self) -> tuple[str, ...]:
        """The consumer segments the front sends into (joined ones included)."""
        return self._feeds.segments

    def front_ids(self) -> list[int]:
        """This front's id on each of its segments."""
        return self._feeds.front_ids

    def _register(self, slot: int) -> None:
        """Register (or, as the successor of a previous run, resume) the front at
        ``slot`` on each of its segments. A clock front registered ahead of its clock
        (its segment passed the clock, a predecessor promised more) counts on from
        there: else it labels at that slot and holds it until the clock catches up
        (a producer's clock minutes slow). Rule 3 holds: labels and beats never go back."""
        clock = self.time_from is None
        self._last_beat = self._feeds.register(slot, self.owner, self.grid, clock=clock)
        if clock:
            self._skew_slots += max(self._last_beat - self._now_slot(), 0)

    @property
    def registered(self) -> bool:
        return self._last_beat >= 0

    @property
    def end_offset(self) -> int:
        """The next record's sequence number (its offset in the front's log)."""
        return self._next_seq

    def _now_slot(self) -> int:
        return self.grid.slot_of(self._clock.now_ms()) + self._skew_slots

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
        times, keep, rejected = self._times(records)
        k = len(times)
        first_seq = self._next_seq
        acks = root_acks(self.front, np.arange(first_seq, first_seq + k, dtype=np.uint64))
        # in flight (heartbeats stop below it) and numbered before the acks leave: a
        # batch whose confirmation fails stays in flight, its ack values never reused
        token = next(self._tokens)
        self._in_flight[token] = (int(times.min()) if k else self._last_beat, k)
        self._next_seq += k
        if k:
            acc = AckAccumulator()
            for feed in self._feeds.items:  # a joined consumer: from where it joined
                at = times >= feed.floor
                acc.add(feed.cell, times[at], acks[at], +1)
            self._agent.add_acks(acc.build(self.grid.window_slots))
            self._max_label = max(self._max_label, int(times.max()))
            if self.confirm:
                self.flush()  # durable send-acks: the tracker has them before the write
        labels = as_label(acks)
        self.late_stats.labelled += k
        return Labelled(rec.with_labels(keep, times, labels), times, labels, first_seq,
                        rejected, token)

    def _times(self, records: Any) -> tuple[npt.NDArray[np.int64], Any, Any]:
        """(labels of the kept records, the kept records, the records handed back)."""
        n = rec.count(records)
        if self.time_from is None:
            now = max(self._now_slot(), self._max_label, self._last_beat)
            return np.full(n, now, np.int64), records, None
        slots = rec.event_times_ms(records, self.time_from) // self.grid.delta_ms
        limit = None if self._ahead_slots is None else self._now_slot() + self._ahead_slots
        valid = self._late.in_range(slots, limit)
        if not self.registered and valid.any():  # the first batch: where event time starts
            self._register(max(int(slots[valid].min()) - self._late.lag_slots, 0))
        times, kept = self._late.apply(slots, self._last_beat, self.late_stats, limit)
        if kept is None:
            return times, records, None
        rejected = rec.take(records, np.setdiff1d(np.arange(n), kept))
        return times, rec.take(records, kept), rejected

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
        self._agent.flush(self.confirm_timeout_s)

    def _send_beat(self, slot: int) -> int:
        for feed in self._feeds.items:  # never below where a joined consumer starts
            self._agent.heartbeat(feed.front_id, max(slot, feed.floor), owner=self.owner)
        self._last_beat = slot
        return slot

    def follow_consumers(self) -> None:
        """Join the consumers that asked to read this front's log since it started,
        and leave the ones released (see :mod:`~lowtide.spark.sources.front_feeds`);
        :meth:`heartbeat` does it every ``FOLLOW_EVERY_S``."""
        with self._lock:
            if self._closed or not self.registered:
                return
            above = max(self._now_slot(), self._max_label, self._last_beat) + 1
            joined = self._feeds.follow(self._next_seq, above, self.owner)
            if joined is not None:  # labels go on at or above where it joined
                self._max_label = max(self._max_label, joined)

    def heartbeat(self) -> int:
        """Promise: no record with a slot below the returned one will follow (and
        report the late counts to the tracker when they changed)."""
        if self._feeds.follows and _time.monotonic() >= self._follow_due:
            self._follow_due = _time.monotonic() + FOLLOW_EVERY_S
            try:
                self.follow_consumers()
            except Exception as exc:  # never stops the heartbeats; tried again, said once
                if str(exc) != self._follow_error:
                    log.warning("consumers not followed", extra={"front": self.front,
                                                                 "error": str(exc)})
                self._follow_error = str(exc)
        with self._lock:
            if self._closed or not self.registered:
                return self._last_beat
            beat = self._send_beat(self._promise(self._current_slot()))
        self._report_late()
        return beat

    def _beat(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self.heartbeat()
            except Exception:  # keep beating through transient agent errors
                continue

    def _report_late(self) -> None:
        """Tell the tracker what this front did with late records (status views show
        it), when the counts changed or every LATE_REPORT_EVERY_S (a restarted tracker
        learns them again); nothing while there are none."""
        stats = self.late_stats
        counts = (stats.late_clamped, stats.late_rejected, stats.late_raised,
                  stats.out_of_range)
        now = _time.monotonic()
        if not any(counts) or (
                counts == self._late_sent and now < self._late_due):
            return
        self._agent.report_late(self.front, counts)
        self._late_sent, self._late_due = counts, now + LATE_REPORT_EVERY_S

    def status(self) -> dict[str, Any]:
        """Counts and times of this front (for logs, status pages and metrics)."""
        with self._lock:
            in_flight = sum(n for _t, n in self._in_flight.values())
            return {"front": self.front, "segments": list(self.segments),
                    "last_heartbeat": self._last_beat, "max_label": self._max_label,
                    "in_flight": in_flight, **self.late_stats.as_dict()}

    def close(self, *, end: bool = True, unregister: bool = False) -> int:
        """Send a last heartbeat, stop heartbeating and close the log; returns the last
        heartbeat (never past a batch labelled but not confirmed written).

        ``end=True`` (the default): the front's input is finished: its last heartbeat
        is the end of time (:data:`~lowtide.core.time.END_MS`), so every window holding
        its records completes once the segment's other fronts pass them; when every
        front of a segment ended, every window does (the end of the input). Nothing may
        follow: a successor of an ended front is refused (:class:`FrontEnded`).
        ``end=False``: a pause (a restart, a deploy): it promises past everything it
        labelled, and a successor with the same owner resumes the front.
        ``unregister=True`` also tells the tracker the front is done (it then no longer
        holds its segment; after ``end=False`` the segment stays where it promised, and
        `lowtide status` shows the windows no front will close)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._closed:
                return self._last_beat
            if self.registered:
                past = max(self._max_label + 1, -1 if self.time_from else self._now_slot())
                self._send_beat(self._promise(max(past, self.grid.end_slot) if end else past))
            self._closed = True
            if self._writer is not None:
                self._writer.close()
        try:
            self._report_late()
        except (LowtideError, OSError, TimeoutError) as exc:  # the counts stay in status()
            log.warning("late counts not reported", extra={"front": self.front,
                                                           "error": str(exc)})
        if unregister and self.registered:
            for fid in self.front_ids():
                self._agent.unregister_front(fid, owner=self.owner)
        return self._last_beat

    def __enter__(self) -> Front:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """The input ends with the block; a block that raised only pauses the front
        (``close(end=False)``): its producer may be run again."""
        self.close(end=exc_type is None)
