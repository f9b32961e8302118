"""The hold of a window planned in Spark's JVM (rule 7 without a hold per window).

Spark emits a window in the micro-batch after the one whose stamp passed its end
(:mod:`.window_plan`); until then the window is complete in ``S_in`` but not in the
outbound segment, whose min time must not pass it. One hold per window query does it:
an ack sent into the state segment ``S_in.state`` at ``H``, the slot of the last
watermark Spark emitted with, and never received while it stands. Every window not yet
emitted ends after that watermark, so its result (slot ``end - 1``) is at or above
``H``, and the outbound segment (bounded by the state segment) stays at or below it.

* First hold: opened by the clock source (:mod:`lowtide.spark.sources.clock`) while
  Spark plans the query's first micro-batch, after its sources registered their
  fronts and before any task received a row, at the state segment's min time (every
  row still to come is at or above it). Opened earlier, with no front registered, it
  would sit at slot 0, and no move could reach today's slots (a move spans at most the
  tracker's checksum table).
* After each micro-batch (its ``StreamingQueryProgress``, posted after its sink
  committed, so its windows were sent): the hold moves to the batch's watermark, in
  one keyed batch that releases the old hold and opens the new one (atomic), in hops
  the checksum table can span. A window planned in the JVM knows more: its results
  sit at window ends less one slot, so its hold goes to the first such slot past the
  watermark (:func:`hold_target`), higher, and moves once a slide, not once a batch.
  A watermark at the last timestamp (every front finished) releases it for good.
  Once registered, the listener catches up with the query's last progress
  (:meth:`HoldListener.catch_up`): no batch ends unheard.
* A tracker that does not answer: a move waits at most the pipeline's
  ``hold_wait_s`` over all its hops; then the query stops with one line that says
  what to do (:class:`HoldFailed`), the hold stays where it was (nothing passes it),
  and later progress events wait for nothing (a listener that waits holds up every
  other listener of the session, and ``SparkContext.stop``).
* Restarts: the hold and a move under way live in a small write-ahead file in the
  checkpoint (``lowtide/hold-<window>.json``); a move's keyed batch ``(file key, target
  slot, "<hold>S_in", 0)`` is written down before it is sent and re-sent after a crash
  (idempotent), so the tracker and the file agree again.

The pure parts (:func:`hold_target`, :func:`hops`, :func:`move_acks`) have worked
examples in their docstrings.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import numpy as np
from pyspark.sql.streaming.listener import StreamingQueryListener

from lowtide.core.acks import child_acks
from lowtide.core.errors import AckBehindHead, LowtideError
from lowtide.core.messages import AckBatch
from lowtide.core.time import TIME_LIMIT, TimeGrid
from lowtide.spark.operators.state_clock import key_hash, state_segment
from lowtide.spark.tracking.receive import STAMP_MAX_MS
from lowtide.spark.tracking.transport import (
    HOLD_WAIT_S,
    TrackerRef,
    batch_key,
    connect,
    tracker_silent,
)

log = logging.getLogger("lowtide.spark.window")

#: a move spans at most this many tracking windows (the checksum table holds 2**20)
HOP_WINDOWS = 1 << 18
#: the target that opens no hold: every front finished, nothing more will be emitted
END = TIME_LIMIT
HOLD_PREFIX = "<hold>"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_PARENT = key_hash("lowtide window hold")


def hop_slots(grid: TimeGrid) -> int:
    return HOP_WINDOWS * grid.window_slots


#: how far past the watermark's slot a hold may stand (a daily window's next end may be
#: a day ahead): the hold's ack then stays well within the tracker's checksum table,
#: which takes acks up to 2**20 windows past a segment's oldest open window
LEAD_SLOTS = 1 << 16


def hold_target(watermark_ms: int, delta_ms: int, slide_ms: int | None = None) -> int:
    """The hold's slot for a batch's watermark (windows ending at or below it are
    emitted); :data:`END` for the last timestamp. ``slide_ms``, the window's slide:
    every window not emitted yet ends past the watermark at a multiple of the slide,
    and its results sit at its end's slot less one, so the hold goes there (at most
    :data:`LEAD_SLOTS` past the watermark's slot): never below the watermark's own
    slot, and it moves once a slide, not once a batch. Without: the watermark's slot.

    >>> hold_target(1_700_000_000_005, 10), hold_target(STAMP_MAX_MS, 10) == END
    (170000000000, True)
    >>> hold_target(1_700_000_000_005, 10, 1000), hold_target(1_700_000_001_000, 10, 1000)
    (170000000099, 170000000199)
    >>> hold_target(1_700_000_000_005, 10, 86_400_000) - 170_000_000_000 == LEAD_SLOTS
    True
    """
    if watermark_ms >= STAMP_MAX_MS:
        return END
    at = watermark_ms // delta_ms
    if slide_ms is None:
        return at
    return min((watermark_ms // slide_ms + 1) * slide_ms // delta_ms - 1, at + LEAD_SLOTS)


def hops(hold: int, target: int, hop: int) -> list[int]:
    """The holds a move from ``hold`` to ``target`` opens one after the other (none if
    ``target`` is not ahead), each at most ``hop`` slots past the one before.

    >>> hops(100, 90, 50), hops(100, 130, 50), hops(100, 230, 50), hops(100, END, 50) == [END]
    ([], [130], [150, 200, 230], True)
    """
    if target <= hold:
        return []
    if target == END:
        return [END]
    return [*range(hold + hop, target, hop), target]


def hold_value(op_id: int, slot: int) -> int:
    """The ack value of operator ``op_id``'s hold at ``slot``: the same after restarts."""
    one = np.array([slot], np.uint64)
    return int(child_acks(np.array([_PARENT], np.uint64), op_id, one)[0])


def move_acks(segment: int, op_id: int, old: int | None, new: int) -> AckBatch:
    """Release the hold at ``old`` (None: none open) and open one at ``new`` (END: none).

    >>> b = move_acks(2, 7, 100, 130)
    >>> b.time.tolist(), b.count.tolist(), int(b.xor[1]) == hold_value(7, 130)
    ([100, 130], [-1, 1], True)
    """
    entries = ([(old, -1)] if old is not None else []) + ([(new, 1)] if new != END else [])
    return AckBatch(np.full(len(entries), segment, np.int32),
                    np.array([t for t, _ in entries], np.int64),
                    np.array([hold_value(op_id, t) for t, _ in entries], np.uint64),
                    np.array([c for _, c in entries], np.int64))


class HoldFailed(LowtideError, RuntimeError):
    """A window's hold could not move within ``hold_wait_s``: its query stopped."""


def hold_failed(window: str, url: str, wait_s: float) -> HoldFailed:
    return HoldFailed(tracker_silent(
        f"window {window!r}", url, "confirm a move of the window's hold", wait_s,
        "the query stopped and emits nothing past the hold"))


@dataclass(frozen=True)
class HoldRecord:
    """The write-ahead file: the key of the hold's keyed batches, whether the first
    hold was opened, the open hold (None: none) and a move under way to ``pending``."""

    key: str
    opened: bool = False
    hold: int | None = None
    pending: int | None = None


class WatermarkHold:
    """One window query's hold; see the module docstring. The driver prepares it and
    moves it (:meth:`listener`); the clock source opens it (:meth:`ensure_open`)."""

    def __init__(self, ref: TrackerRef, window: str, op_id: int, checkpoint: str,
                 slide_ms: int | None = None) -> None:
        self.ref = ref
        self.slide_ms = slide_ms  # hold_target's: results only at window ends
        self.window = window
        self.op_id = op_id
        self.checkpoint = checkpoint
        self.segment = state_segment(window)
        self.path = os.path.join(checkpoint, "lowtide", f"hold-{window}.json")
        self._lock = threading.Lock()
        self.record = HoldRecord("")
        self.closed = False

    # ------------------------------------------------------------ write-ahead file
    def _load(self) -> HoldRecord | None:
        try:
            with open(self.path) as f:
                return HoldRecord(**json.load(f))
        except FileNotFoundError:
            return None

    def _save(self, record: HoldRecord) -> None:
        """Write ``record`` atomically and durably: synced, then renamed over the file.
        The completion too: a rename whose data was not synced may leave, after a
        machine crash, an empty file in place of the write-ahead it replaced, and the
        restart nothing to start from (rule 14)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(asdict(record), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self.record = record

    # ------------------------------------------------------------ moves
    def _move(self, new: int, timeout_s: float = HOLD_WAIT_S) -> None:
        """Move the hold to ``new`` (write-ahead, then the keyed batch, then done);
        TimeoutError if the tracker did not confirm within ``timeout_s`` (the move stays
        pending: :meth:`prepare` sends it again)."""
        old = self.record.hold
        self._save(replace(self.record, pending=new))
        agent: Any = connect(self.ref)
        acks = move_acks(self.ref.graph.index(self.segment), self.op_id, old, new)
        agent.send_batch(batch_key(self.record.key, new, HOLD_PREFIX + self.window, 0), acks,
                         timeout_s=timeout_s)
        self._save(replace(self.record, opened=True, hold=None if new == END else new,
                           pending=None))

    def prepare(self) -> None:
        """Before the query starts: make the file, or finish a move a crash cut short;
        then open the first hold if a front feeds the window already (a re-run batch
        reads its logged offsets: the clock is not asked again)."""
        with self._lock:
            record = self._load()
            if record is None:
                self._save(HoldRecord(uuid.uuid4().hex))
            else:
                self.record = record
                if record.pending is not None:
                    self._finish_pending(record)
        self.ensure_open(wait_s=0.0)

    def _finish_pending(self, record: HoldRecord) -> None:
        assert record.pending is not None
        try:
            self._move(record.pending)
        except AckBehindHead:
            if record.opened:
                raise RuntimeError(
                    f"window {self.window!r}: the tracker does not have this window's "
                    "hold (a new tracker with an old checkpoint?): start the query "
                    "from a new checkpoint") from None
            self._save(replace(record, pending=None))  # ensure_open tries again

    def ensure_open(self, wait_s: float = 1.0) -> bool:
        """Open the first hold, at the state segment's min time, unless it is open:
        called while Spark plans a micro-batch, before its tasks run. A min time of 0
        means the tracker has not seen the fronts the sources just registered: wait for
        them up to ``wait_s``. True once the hold is open."""
        from lowtide.service.clock import wall_ms

        with self._lock:
            if not self.record.opened:
                self.record = self._load() or self.record
            if self.record.opened:
                return True
            agent: Any = connect(self.ref)
            deadline = time.monotonic() + wait_s
            while True:
                slot = int(agent.min_time_at(self.segment, wall_ms()))
                if slot == 0 and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                if slot == 0:
                    return False
                try:
                    self._move(slot)
                    return True
                except AckBehindHead:  # the segment moved on meanwhile: again, higher
                    self._save(replace(self.record, pending=None))

    def advance(self, watermark_ms: int, wait_s: float = HOLD_WAIT_S) -> None:
        """After a micro-batch emitted every window ending at or below
        ``watermark_ms``: move the hold there, waiting at most ``wait_s`` for the
        tracker over every hop (TimeoutError after)."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            if self.closed:
                return
            if not self.record.opened:  # the clock source's process opens it
                self.record = self._load() or self.record
            if not self.record.opened or self.record.hold is None or self.record.pending:
                return
            target = hold_target(watermark_ms, self.ref.grid.delta_ms, self.slide_ms)
            for slot in hops(self.record.hold, target, hop_slots(self.ref.grid)):
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    raise TimeoutError(f"the hold's move took over {wait_s:g} s")
                self._move(slot, left_s)

    def close(self) -> None:
        """The query stopped: later progress events move nothing (its tracker may be
        closed next; a move blocked on it would hold up every listener of the session).
        Waits for a move under way."""
        with self._lock:
            self.closed = True

    def listener(self, query_id: str, wait_s: float = HOLD_WAIT_S,
                 on_failure: Callable[[HoldFailed], None] | None = None) -> HoldListener:
        return HoldListener(self, query_id, wait_s, on_failure)


def watermark_ms(progress: Any) -> int | None:
    """A ``StreamingQueryProgress``'s watermark (ms), None without one."""
    text = (progress.eventTime or {}).get("watermark")
    return None if text is None else iso_ms(text)


def iso_ms(text: str) -> int:
    """Milliseconds since the epoch of Spark's progress timestamps.

    >>> iso_ms("2023-11-14T22:13:20.005Z")
    1700000000005
    """
    return (datetime.fromisoformat(text) - EPOCH) // timedelta(milliseconds=1)


class HoldListener(StreamingQueryListener):  # type: ignore[misc]
    """Moves a window's hold after each micro-batch of its query; a move the tracker
    did not confirm within ``wait_s`` hands :class:`HoldFailed` to ``on_failure``
    (which stops the query) once, and later events move nothing.

    Registered like any listener, but Spark calls :class:`ProgressCallback`, which reads
    the two figures it needs from the Java event: PySpark's own wrapper converts every
    event of every query of the session whole (each operator's and source's figures,
    each a Py4J call run on Spark's listener thread), 0.5-0.7 us per input row of a
    window query (BENCHMARKS.md).

    Registered after its query started (its id is drawn then), so a short query can run
    every batch it has (a finished input) before the listener hears of one: the caller
    then calls :meth:`catch_up`, which reads the query's last progress, recorded before
    Spark posts its event."""

    def __init__(self, hold: WatermarkHold, query_id: str, wait_s: float = HOLD_WAIT_S,
                 on_failure: Callable[[HoldFailed], None] | None = None) -> None:
        super().__init__()
        self.hold = hold
        self.query_id = query_id
        self.wait_s = wait_s
        self.on_failure = on_failure
        self.failed: HoldFailed | None = None

    def catch_up(self, last_progress: Any) -> None:
        """Move the hold to the watermark of the query's last progress (None: no batch
        ended yet), read after this listener was registered: with the events it hears
        from then on, every batch's watermark reaches the hold."""
        self.advance(None if last_progress is None else watermark_ms(last_progress))

    @property
    def _jlistener(self) -> Any:
        if not hasattr(self, "_jcallback"):
            from pyspark import SparkContext

            jvm: Any = SparkContext._jvm
            self._jcallback = jvm.PythonStreamingQueryListenerWrapper(ProgressCallback(self))
        return self._jcallback

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        if str(event.progress.id) == self.query_id:
            self.advance(watermark_ms(event.progress))

    def advance(self, wm: int | None) -> None:
        """Its query's batch ended with watermark ``wm`` (ms; None: none yet)."""
        if wm is None or self.failed is not None:
            return
        try:
            self.hold.advance(wm, self.wait_s)
        except TimeoutError as exc:  # fail closed: the hold stays, the query stops
            self.failed = hold_failed(self.hold.window, self.hold.ref.url, self.wait_s)
            log.error(str(self.failed), extra={"reason": str(exc)})
            if self.on_failure is not None:
                self.on_failure(self.failed)
        except Exception as exc:  # the hold stays where it was: nothing passes it
            log.warning("window hold not moved",
                        extra={"window": self.hold.window, "reason": repr(exc)})

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


class ProgressCallback:
    """The Java listener (``PythonStreamingQueryListener``, through Py4J) of a
    :class:`HoldListener`: per progress event, its query's id and watermark."""

    def __init__(self, listener: HoldListener) -> None:
        self.listener = listener

    def onQueryProgress(self, jevent: Any) -> None:
        try:
            progress = jevent.progress()
            if progress.id().toString() != self.listener.query_id:
                return
            text = progress.eventTime().get("watermark")
        except Exception as exc:  # the JVM going away: the hold stays where it was
            log.warning("window hold not moved", extra={
                "window": self.listener.hold.window, "reason": repr(exc)})
            return
        self.listener.advance(None if text is None else iso_ms(text))

    def onQueryStarted(self, jevent: Any) -> None:
        pass

    def onQueryIdle(self, jevent: Any) -> None:
        pass

    def onQueryTerminated(self, jevent: Any) -> None:
        pass

    class Java:
        implements: ClassVar[list[str]] = [
            "org.apache.spark.sql.streaming.PythonStreamingQueryListener"]
