"""``lowtide_loop``: the Spark source that feeds a retry loop's rows back into its step.

A step with a retry policy (:mod:`lowtide.spark.operators.retry`) writes the rows that
failed into loop files (:mod:`lowtide.spark.sources.retry_log`) and sends them into
its loop segment (``<step>.retry``); this source reads them in a later micro-batch,
unioned with the step's other input, and is the loop segment's receiver: each task
receives its file's rows out of the loop segment and sends them into the step's
segment with the same time and id (rule 11: items keep their time around the loop),
in one keyed batch (rule 6) before its rows go on. The loop segment and the step's
segment are one component of the graph, sharing one min time: a row waiting in a loop
file holds every window at or above its time.

Offsets are ``{"after": <the last loop file read>}``, in Spark's checkpoint: files
are named by (micro-batch, partition) of the task that wrote them, so they sort in the
order they were written, and a micro-batch's files are all written before Spark asks
for the next offsets (a batch ends when its tasks have). A restarted query reads from
its checkpoint's offsets again: a file is read once, and deleted once committed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from lowtide.spark.sources.log_source import submit_task_batch
from lowtide.spark.sources.retry_log import drop_loop_files, loop_files, read_loop_file
from lowtide.spark.tracking.column import (
    TRACK_COL,
    AckAccumulator,
    ack_ids,
    reference_slot,
    slots_of,
)
from lowtide.spark.tracking.transport import TrackerRef

try:  # the module must import without pyspark for the pure tests
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
except ImportError:  # pragma: no cover
    DataSource = DataSourceStreamReader = InputPartition = object  # type: ignore[misc,assignment]

NAME = "lowtide_loop"


class LoopPartition(InputPartition):  # type: ignore[misc]
    """One loop file; ``index``: its place in the micro-batch (the batch key's
    partition: the same on every re-run of the batch)."""

    def __init__(self, name: str, index: int) -> None:
        self.name, self.index = name, index

    def __repr__(self) -> str:
        return f"LoopPartition({self.name!r}, {self.index})"


def loop_partitions(directory: str, start: dict[str, str],
                    end: dict[str, str]) -> list[LoopPartition]:
    """The loop files in ``(start, end]``, in name order."""
    names = [n for n in loop_files(directory) if start["after"] < n <= end["after"]]
    return [LoopPartition(n, i) for i, n in enumerate(names)]


def receive_loop_rows(ref: TrackerRef, loop: str, step: str, table: Any,
                      partition: int) -> Any:
    """Submit one loop file's keyed batch: its rows received out of ``loop`` and sent
    into ``step``, same times and ids (not waited for); returns the batch."""
    packed = table[TRACK_COL].to_numpy()
    ref_slot = reference_slot(ref.grid)
    times, ids = slots_of(packed, ref_slot), ack_ids(packed)
    acc = AckAccumulator()
    acc.add(ref.graph.index(step), times, ids, +1)  # children first (rule 2)
    acc.add(ref.graph.index(loop), times, ids, -1)
    return submit_task_batch(ref, loop, partition, acc)


class LoopStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]) -> None:
        self.path = options["path"]
        self.ref = TrackerRef.from_option(options["lowtide.tracker"])
        self.loop = options["lowtide.segment"]
        self.step = options["lowtide.out"]

    def initialOffset(self) -> dict[str, str]:
        return {"after": ""}

    def latestOffset(self, start: dict[str, str], limit: Any = None) -> dict[str, str]:
        names = loop_files(self.path)
        return {"after": max(names[-1], start["after"]) if names else start["after"]}

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> list[LoopPartition]:
        return loop_partitions(self.path, start, end)

    def read(self, partition: LoopPartition) -> Iterator[Any]:
        table = read_loop_file(self.path, partition.name)
        sent = receive_loop_rows(self.ref, self.loop, self.step, table, partition.index)
        yield from table.to_batches()
        sent.wait()

    def commit(self, end: dict[str, str]) -> None:
        """Spark will not read up to ``end`` again: delete those files."""
        drop_loop_files(self.path, end["after"])


class LoopSource(DataSource):  # type: ignore[misc]
    """``spark.readStream.format("lowtide_loop")``; options ``path`` (the retry
    directory), ``schema`` (the step's input columns, Spark's JSON), and the tracker,
    the loop segment and the step's segment. See the module docstring."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> Any:
        from pyspark.sql.types import StructType

        return StructType.fromJson(json.loads(self.options["schema"]))

    def streamReader(self, schema: Any) -> LoopStreamReader:
        return LoopStreamReader({k.lower(): v for k, v in self.options.items()})


__all__ = ["LoopPartition", "LoopSource", "LoopStreamReader", "loop_partitions",
           "receive_loop_rows"]
