"""The clock source, ``format("lowtide_clock")``: the min time of a window's inbound
segment as a stream, so the window's watermark moves while no row arrives (a lagging
front's heartbeats, every front finished) and its windows are emitted without new data.

It also opens the window's first hold (:mod:`lowtide.spark.operators.window_hold`)
while Spark plans the first micro-batch, before any task received a row.

A window planned in Spark's JVM (:mod:`lowtide.spark.operators.window_plan`) takes its
watermark from stamps its receive step puts on the rows; with no rows, no batch runs.
This reader runs on the driver (``SimpleDataSourceStreamReader``): its offset is the
segment's min time, rounded down to the window's slide (no window can close between
two such times), so Spark runs a micro-batch when a window may have become complete;
that batch carries one row, the stamp, and the batch after it (Spark runs one when the
watermark moved) emits the windows.

Safe like the receive step's stamps (:mod:`lowtide.spark.tracking.receive`): the
offset of batch ``N`` is read while Spark plans it, before any of its tasks ran, so
every row below it was received by a batch before ``N``; a re-run batch reads its
logged offsets again.

The reader subscribes to the segment's min time and answers from the last update
the tracker pushed: a min time the tracker announced before the batch was planned,
so just as safe, without a tracker round trip on the query's thread each batch
(lowtide's offsets phase, this round trip and the runners', took 175 ms of a 9.4 s
micro-batch at load 20, the watermark query's 3 ms). The client sends a
subscription again on every new connection, and the tracker answers it with the
current min time first, so the last update stays the latest the reader can know;
until the first one arrived, it asks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast

from lowtide.spark.tracking.receive import STAMP_MAX_MS, read_stamp, stamp_ms
from lowtide.spark.tracking.transport import TrackerRef, connect

try:
    from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
except ImportError:  # pragma: no cover
    DataSource = SimpleDataSourceStreamReader = object  # type: ignore[misc,assignment]

CLOCK_SCHEMA = "lt_wm long"


class Pushing(Protocol):
    """The driver's agent (``lowtide.service.Agent``): it pushes min time updates."""

    def on_update(self, callback: Callable[[Any], None],
                  segment: str | None = None) -> Callable[[], None]: ...


def clock_offset(stamp: int, step_ms: int) -> int:
    """The clock's offset for a stamp (ms): rounded down to ``step_ms``; the last
    stamp (the input ended) as it is, so the hold is released for good.

    >>> clock_offset(1_700_000_001_234, 500), clock_offset(STAMP_MAX_MS, 500) == STAMP_MAX_MS
    (1700000001000, True)
    """
    return stamp if stamp >= STAMP_MAX_MS else stamp // step_ms * step_ms


class ClockReader(SimpleDataSourceStreamReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]) -> None:
        self.ref = TrackerRef.from_option(options["lowtide.tracker"])
        self.segment = options["lowtide.segment"]
        self.step_ms = int(options["step_ms"])
        self.op_id = int(options["op_id"])
        self.checkpoint = options["checkpoint"]
        self.opened = False
        self._pushed: int | None = None  # the last pushed min time, as a stamp
        self._subscribed = False

    def _on_update(self, update: Any) -> None:  # on the agent's thread
        self._pushed = stamp_ms(int(update.time), self.ref.grid)

    def stamp(self) -> int:
        """The segment's min time as a stamp: the last one pushed, else asked."""
        if not self._subscribed:
            self._subscribed = True
            # on the driver: a service Agent (or the stand-in registered for the scheme)
            cast(Pushing, connect(self.ref)).on_update(self._on_update, self.segment)
        pushed = self._pushed
        return read_stamp(self.ref, self.segment) if pushed is None else pushed

    def _open_hold(self) -> bool:
        """Open the window's first hold unless it is open (see window_hold)."""
        from lowtide.spark.operators.window_hold import WatermarkHold

        if not self.opened:
            hold = WatermarkHold(self.ref, self.segment, self.op_id, self.checkpoint)
            self.opened = hold.ensure_open()
        return self.opened

    def initialOffset(self) -> dict[str, Any]:
        return {"ms": 0}

    def read(self, start: dict[str, Any]) -> tuple[Iterator[tuple[int]], dict[str, Any]]:
        # the first hold, before the first rows are received: Spark asks the sources for
        # offsets in plan order, the window's input before this clock
        if not self._open_hold():
            return iter(()), start
        now = clock_offset(self.stamp(), self.step_ms)
        if now <= int(start["ms"]):
            return iter(()), start
        return iter([(now,)]), {"ms": now}

    def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]
                           ) -> Iterator[tuple[int]]:
        return iter([(int(end["ms"]),)] if int(end["ms"]) > int(start["ms"]) else [])

    def commit(self, end: dict[str, Any]) -> None:
        return None


class ClockSource(DataSource):  # type: ignore[misc]
    @classmethod
    def name(cls) -> str:
        return "lowtide_clock"

    def schema(self) -> str:
        return CLOCK_SCHEMA

    def simpleStreamReader(self, schema: Any) -> ClockReader:
        return ClockReader({k.lower(): v for k, v in self.options.items()})


def clock_frame(spark: Any, ref: TrackerRef, segment: str, step_ms: int,
                hold: tuple[int, str]) -> Any:
    """The clock of the window whose inbound segment is ``segment``, as a streaming
    DataFrame (column ``lt_wm``, ms); ``hold``: its operator id and checkpoint."""
    return (spark.readStream.format("lowtide_clock").schema(CLOCK_SCHEMA)  # no Python call
            .option("lowtide.tracker", ref.to_option()).option("lowtide.segment", segment)
            .option("step_ms", str(step_ms)).option("op_id", str(hold[0]))
            .option("checkpoint", hold[1]).load())
