"""The receive step of a window planned in Spark's JVM, fused into the task of each
step that sends into the window's inbound segment ``S_in`` (a lowtide source, or a
chain of tracked Arrow steps: every row crosses into Python there already): the rows
it hands on are acked as received out of ``S_in`` and carry two columns: ``lt_ts``,
the row's global time (its slot's start, a timestamp: the full slot, which the receive
step unwraps anyway, so the window's plan has no unwrap of ``lt_track`` of its own to
plan in every micro-batch), and ``lt_wm`` (ms), 0 except on the task's last rows,
which carry the *stamp*: ``S_in``'s min time read after the receipts were confirmed.
Spark's watermark is driven by the stamps
(:mod:`lowtide.spark.operators.window_plan`).

Per task (rules 5 and 6): the receipts of all its rows, XOR-reduced per slot, are ONE
keyed batch ``(query id, batch id, "<receive>S_in<-sender", partition)``, submitted
after the sender's own batch is confirmed; the task waits for their confirmation, then
reads the stamp and hands back its last rows. Received in the sender's task is
received in the micro-batch that aggregates the rows: every row a task hands on goes
into that batch's aggregation, as Spark commits a batch whole (the steps between must
keep rows 1:1, as untracked steps must anyway).

Why a stamp is safe (rule S below). Let ``w`` be a stamp read in micro-batch ``N``:

* a row received in a batch ``M > N`` was not received when ``w`` was read (its
  receive-ack was applied after): it was in flight in ``S_in`` or not yet sent, so its
  slot is ``>= w``. Spark drops a row as late only if its window ends at or below the
  watermark, and the watermark of batch ``M`` is the maximum stamp of batches ``< M``:
  no row is ever dropped;
* every row with a slot ``< w`` was received before ``w`` was read, by a task of batch
  ``<= N`` (a failed attempt's rows are the retry's rows; a batch re-run after a
  restart reads the same offsets), so it is in the state Spark committed with batch
  ``N``; Spark applies the watermark from batch ``N + 1`` on, so a window it emits
  (end ``<=`` watermark) holds every one of its rows.

A receive pass of its own (an Arrow UDF over ``lt_track`` before the aggregation)
costs about a quarter of the query's CPU (BENCHMARKS.md): hence the fusion.

A ``where`` between the senders and the window (with only 1:1 steps around it) is
absorbed by the window: the senders receive out of the ``where``'s inbound segment,
Spark's own filter drops rows in the JVM, and the window's segment sees no item at all
(its min time is its bound, the ``where``'s: rule 4). The argument above holds as it
is: a row the filter drops was received, like every other, in the batch that drops
it; the stamp is still the window's segment's min time. A task whose stamped rows
are all dropped moves no watermark; the clock source's stamp does
(:mod:`lowtide.spark.sources.clock`).

A segment split into key ranges (rule 15; a window with ``key_ranges`` planned in the
JVM: :mod:`lowtide.spark.operators.window_driver`) has each row's receipt acked in its
range's cell (its front's range); the stamp is still the whole segment's min time, the
least of its ranges'.

Attempts may read different stamps: each is a min time of ``S_in``, at most the true
one, and Spark records each batch's watermark in its offset log before the batch runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from lowtide.core.time import TimeGrid
from lowtide.spark.tracking.column import (
    TRACK_COL,
    AckAccumulator,
    reference_slot,
    slots_of,
)
from lowtide.spark.tracking.key_ranges import range_cells
from lowtide.spark.tracking.task_errors import answered_within
from lowtide.spark.tracking.transport import TrackerRef, connect, together
from lowtide.wire.messages import LATEST_MS

RECEIVE_PREFIX = "<receive>"
WM_COL = "lt_wm"  # the stamp: the segment's min time (ms)
TS_COL = "lt_ts"  # the row's global time (its full slot's start), a timestamp
#: the columns the receive step adds, in order, last
STAMP_COLS = (TS_COL, WM_COL)
#: the largest stamp, 9999-12-31T23:59:59.999Z (Spark's last timestamp): a min time past
#: it means "nothing more will come" (every front finished)
STAMP_MAX_MS = 253_402_300_799_999


def stamp_ms(min_time: int, grid: TimeGrid) -> int:
    """The stamp (ms since the epoch) of a min time (a slot); a min time that says the
    input ended (every front closed: :meth:`TimeGrid.at_end`) is the last stamp.

    >>> g = TimeGrid(10)
    >>> stamp_ms(170_000_000_000, g), stamp_ms(g.end_slot, g) == STAMP_MAX_MS
    (1700000000000, True)
    """
    if grid.at_end(min_time):
        return STAMP_MAX_MS
    return min(min_time * grid.delta_ms, STAMP_MAX_MS)


def ask_stamp(ref: TrackerRef, segment: str) -> Callable[[], int]:
    """Ask for ``segment``'s latest min time, as a stamp, without waiting; the call
    returned waits for it. The tracker answers after the step that follows the question,
    which comes after every request this process's agent issued before it on its
    connection: a task's receipts submitted just before are in the answer, and one
    round trip serves both (a sharded tracker's shards are other connections: there the
    answer may not hold them, a lower stamp, as safe). A stamp need not be the same in
    every attempt (this module's last paragraph), so it does not wait for the tracker's
    clock to pass this millisecond, as a final answer would."""
    agent: Any = connect(ref)
    pending = agent.ask_min_time_at(segment, LATEST_MS, ref.wait_s)

    def wait() -> int:
        with answered_within(ref, f"asking for segment '{segment}''s min time"):
            return stamp_ms(int(pending.wait()), ref.grid)

    return wait


def read_stamp(ref: TrackerRef, segment: str) -> int:
    """``segment``'s latest min time, as a stamp: everything confirmed before is in it
    (:func:`ask_stamp`, waited for)."""
    return ask_stamp(ref, segment)()


def stamped(ref: TrackerRef, segment: str, key: str, batches: Iterable[Any],
            out_of: str | None = None, send: Callable[[], Sequence[Any]] = tuple
            ) -> Iterator[Any]:
    """``batches`` (Arrow record batches with ``lt_track``) received out of
    ``segment`` (or ``out_of``, a segment upstream of it whose step the window
    absorbed: see below) and stamped with ``segment``'s min time: each with the
    columns ``lt_ts`` (:func:`with_time`) and ``lt_wm`` (ms), 0 on all but the last,
    which is held back until the receipts are confirmed and carries the stamp. The
    receipts are ONE keyed batch ``(query, batch, key, partition)``, submitted once
    ``batches`` is exhausted, after the batch of the step that produced them: that
    step confirms its batch before ``batches`` ends, or leaves it to ``send``, which
    submits it here, first: the sender's batch, the receipts and the stamp's question
    then go in one write, which the tracker reads at one wake-up and applies in order,
    and are answered in one; all are confirmed before the last rows go."""
    from lowtide.spark.sources.log_source import submit_task_batch

    idx = ref.graph.index(out_of or segment)
    split = bool(ref.graph.ranges_of(idx))
    acc = AckAccumulator()
    ref_slot = reference_slot(ref.grid)
    last = None
    for batch in batches:
        packed = np.asarray(batch.column(batch.schema.get_field_index(TRACK_COL)).to_numpy(
            zero_copy_only=False), np.int64)
        if not split:
            acc.add_packed(idx, packed, ref_slot, -1)
        elif batch.num_rows:  # a segment split into key ranges: each row in its range's
            cells = range_cells(ref.graph, idx, batch)
            present = np.unique(cells)
            for cell in present.tolist():
                acc.add_packed(cell, packed if len(present) == 1 else packed[cells == cell],
                               ref_slot, -1)
        if last is not None:
            yield with_stamp_column(last, 0)
        last = with_time(batch, packed, ref_slot, ref.grid)
    if last is None:  # no rows: the sender's batch alone (its heartbeats)
        for batch in send():
            batch.wait()
        return
    with together(ref):  # one write, one wake-up of the tracker, one of its replies
        sent = send()
        receipts = submit_task_batch(ref, key, task_partition(), acc)
        stamp = ask_stamp(ref, segment)
    for batch in (*sent, receipts):
        batch.wait()
    yield with_stamp_column(last, stamp())


def with_time(batch: Any, packed: Any, ref_slot: int, grid: TimeGrid) -> Any:
    """``batch`` with the column ``lt_ts``: each row's full slot (``packed``, its
    ``lt_track``, unwrapped against ``ref_slot``, this task's clock, with
    :func:`~lowtide.spark.tracking.column.unwrap`'s range check) times ``delta_ms``.

    >>> import pyarrow as pa
    >>> from lowtide.spark.tracking.column import pack
    >>> g = TimeGrid(10)
    >>> b = pa.record_batch({"x": [1]})
    >>> t = with_time(b, pack(np.array([170_000_000_000]), np.array([7], np.uint64),
    ...                       170_000_000_000), 170_000_000_000, g).column(TS_COL)
    >>> t.type, t[0].value // 1000, with_stamp_column(b, 5).column(WM_COL).to_pylist()
    (TimestampType(timestamp[us, tz=UTC]), 1700000000000, [5])
    """
    import pyarrow as pa

    micros = slots_of(packed, ref_slot) * np.int64(grid.delta_ms * 1000)
    kind = pa.timestamp("us", tz="UTC")
    return batch.append_column(pa.field(TS_COL, kind, nullable=False), pa.array(micros, kind))


def with_stamp_column(batch: Any, stamp: int) -> Any:
    """``batch`` with the column ``lt_wm``: ``stamp`` on every row. Like ``lt_ts``, not
    nullable: the schema the receiving source declares (a source's Arrow batches must
    match it exactly)."""
    import pyarrow as pa

    column = pa.array(np.full(batch.num_rows, stamp, np.int64))
    return batch.append_column(pa.field(WM_COL, pa.int64(), nullable=False), column)


def task_partition() -> int:
    from pyspark import TaskContext

    tc = TaskContext.get()
    return tc.partitionId() if tc is not None else 0
