"""Where a window planned in Spark's JVM receives its rows: in the tasks of the steps
that send into its inbound segment (:func:`lowtide.spark.tracking.receive.stamped`).

* a lowtide source (``lowtide_gen``, ``lowtide_log``) feeding the window through
  untracked steps: read through :class:`ReceivingSource`, which wraps the source's
  reader and receives and stamps what each of its tasks read;
* a chain of tracked Arrow steps (a map, a filter, a labelled stream's entry, the
  Arrow half of ``where``): its ``mapInArrow`` function wrapped by
  :func:`receiving_task`.

Either way the rows cross into Python once, as they would without the window; a
``where`` in front of the window does not add a crossing: the window absorbs it
(:mod:`lowtide.spark.tracking.receive`), and the senders receive out of its inbound
segment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from lowtide.spark.sources.generator import GenSource
from lowtide.spark.sources.log_replay import LogReplaySource
from lowtide.spark.sources.log_source import LogSource
from lowtide.spark.tracking.receive import RECEIVE_PREFIX, TS_COL, WM_COL, stamped
from lowtide.spark.tracking.transport import TrackerRef

try:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader
except ImportError:  # pragma: no cover
    DataSource = DataSourceStreamReader = object  # type: ignore[misc,assignment]

SOURCES = {"lowtide_gen": GenSource, "lowtide_log": LogSource,
           "lowtide_log_replay": LogReplaySource}
FORMAT = "lowtide_receiving"


def receive_key(window: str, sender: str) -> str:
    """The key segment of a sender's receipts: senders of a union may run in stages
    whose partitions have the same numbers."""
    return f"{RECEIVE_PREFIX}{window}<-{sender}"


def receiving_task(run: Callable[[Iterator[Any]], Iterator[Any]], ref: TrackerRef,
                   window: str, sender: str, out_of: str | None = None
                   ) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A tracked chain's ``mapInArrow`` function ``run`` whose output rows are received
    by the window (and stamped) in the same task; ``out_of``: the segment they are
    received out of, when the window absorbed the ``where`` steps in front of it."""

    def receiving(batches: Iterator[Any]) -> Iterator[Any]:
        return stamped(ref, window, receive_key(window, sender), run(batches), out_of)

    return receiving


def with_stamp(schema: Any) -> Any:
    """A schema (DDL string or StructType) with the receive step's columns last: the
    row's time and the stamp (:func:`lowtide.spark.tracking.receive.stamped`). Neither
    is ever null: the window's plan then has no null test on its time column."""
    from pyspark.sql.types import LongType, StructField, StructType, TimestampType

    if isinstance(schema, str):
        return f"{schema}, {TS_COL} timestamp NOT NULL, {WM_COL} long NOT NULL"
    return StructType([*schema.fields, StructField(TS_COL, TimestampType(), False),
                       StructField(WM_COL, LongType(), False)])


class ReceivingReader(DataSourceStreamReader):  # type: ignore[misc]
    """A lowtide source's reader whose tasks also receive and stamp what they read."""

    def __init__(self, inner: Any, options: dict[str, str]) -> None:
        self.inner = inner
        self.ref = TrackerRef.from_option(options["lowtide.tracker"])
        self.window = options["lowtide.receive"]
        self.key = receive_key(self.window, options["lowtide.sender"])
        self.out_of = options.get("lowtide.receive_from")

    def initialOffset(self) -> Any:
        return self.inner.initialOffset()

    def latestOffset(self, start: Any, limit: Any = None) -> Any:
        return self.inner.latestOffset(start, limit)

    def partitions(self, start: Any, end: Any) -> Any:
        return self.inner.partitions(start, end)

    def read(self, partition: Any) -> Iterator[Any]:
        prepared = getattr(self.inner, "prepared", None)
        if prepared is None:  # the source confirms its own batch before its rows end
            return stamped(self.ref, self.window, self.key, self.inner.read(partition),
                           self.out_of)
        batches, submit = prepared(partition)  # sent with the receipts: one write
        return stamped(self.ref, self.window, self.key, batches, self.out_of, submit)

    def commit(self, end: Any) -> None:
        self.inner.commit(end)


class ReceivingSource(DataSource):  # type: ignore[misc]
    """``format("lowtide_receiving")``: option ``lowtide.inner`` names the source it
    reads (``lowtide_gen`` or ``lowtide_log``, with that source's options),
    ``lowtide.receive`` the window, ``lowtide.sender`` the source's name in the plan,
    ``lowtide.receive_from`` (optional) the segment it receives out of, when the
    window absorbed the ``where`` steps in front of it."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _inner(self) -> Any:
        return SOURCES[str(self.options["lowtide.inner"])](self.options)

    def schema(self) -> str:
        return str(with_stamp(self._inner().schema()))

    def streamReader(self, schema: Any) -> ReceivingReader:
        options = {k.lower(): v for k, v in self.options.items()}
        return ReceivingReader(self._inner().streamReader(schema), options)
