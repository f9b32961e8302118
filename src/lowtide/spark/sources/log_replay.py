"""Replay by time: the ingest log's records of a time range, read again as a stream
(``format("lowtide_log_replay")``, what ``Pipeline.replay`` reads).

Record times are non-decreasing within a front, so a time range ``[from, to)`` is one
offset range per front (:func:`replay_offsets`, the index's ``offset_of_time``): the
records a front wrote with a time in the range, and no other.

A replay runs on a tracker of its own (the replayed records were acked on the original
one already), where the source is the front, as the generator is: each task sends its
rows into the first step's segment and, in the same idempotent batch after them
(rules 3 and 6), the heartbeat of its front: the time of the front's next record in
the range, or ``to`` once the task read the range's last one. So the replay's min times
reach ``to`` exactly when every replayed row below it is through. The ingest segment
carries no item in a replay; its fronts are registered there (owner
:func:`~lowtide.spark.sources.log_source.source_owner`) to bound it.

A replay is no consumer of the log: it holds no retention back, and a range whose files
retention deleted fails on read (``RecordsDeleted``), never replays less.

>>> import tempfile
>>> from lowtide.spark.sources.ingest import IngestWriter
>>> d = tempfile.mkdtemp()
>>> w = IngestWriter(d, front=0, fsync="never")
>>> for t in (10, 10, 12, 15):
...     _ = w.append([b"x"], time=t)
>>> replay_offsets(d, None, 11, 15)
{0: (2, 3)}
>>> next_times(d, {0: (2, 3)}, 15)
{0: (12, 15)}
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lowtide.core.messages import Heartbeat
from lowtide.spark.sources.ingest import IngestReader, list_fronts
from lowtide.spark.sources.log_source import (
    FrontPartition,
    LogStreamReader,
    ensure_front,
    front_key,
    read_log_partition,
    source_owner,
    submit_task_batch,
)
from lowtide.spark.tracking.column import AckAccumulator, ack_ids, attach, pack, reference_slot
from lowtide.spark.tracking.transport import connect

try:
    from pyspark.sql.datasource import DataSource
except ImportError:  # pragma: no cover
    DataSource = object  # type: ignore[misc,assignment]

__all__ = ["LogReplaySource", "next_times", "replay_offsets"]

#: the option carrying ``"<from slot>:<to slot>"``
RANGE_OPTION = "lowtide.replay"


def replay_offsets(directory: str, fronts: list[int] | None, from_slot: int,
                   to_slot: int) -> dict[int, tuple[int, int]]:
    """Per front of the log (``fronts``: these only): the offsets ``[start, end)`` of
    its records with a time in ``[from_slot, to_slot)``."""
    if to_slot < from_slot:
        raise ValueError(f"replay range [{from_slot}, {to_slot}) ends before it starts")
    ids = fronts if fronts is not None else list_fronts(directory)
    out = {}
    for f in ids:
        reader = IngestReader(directory, f)
        out[f] = (reader.offset_of_time(from_slot), reader.offset_of_time(to_slot))
    return out


def _time_at(directory: str, front: int, offset: int) -> int:
    times, _payloads = IngestReader(directory, front).read(offset, offset + 1, verify=False)
    return int(times[0])


def next_times(directory: str, ranges: dict[int, tuple[int, int]],
               to_slot: int) -> dict[int, tuple[int, int]]:
    """Per front: (the time its replay starts at: its first record's, or ``to_slot`` if
    it has none in the range; ``to_slot``)."""
    return {f: (_time_at(directory, f, lo) if hi > lo else to_slot, to_slot)
            for f, (lo, hi) in ranges.items()}


class LogReplayReader(LogStreamReader):
    """The ingest log's records of one time range, its source the front (see the
    module docstring)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        lo, hi = options[RANGE_OPTION].split(":")
        self.from_slot, self.to_slot = int(lo), int(hi)
        self._ranges: dict[int, tuple[int, int]] | None = None

    def ranges(self) -> dict[int, tuple[int, int]]:
        """The offsets of the range, fixed at the first call (each run of the reader
        computes the same: the records below ``to`` were all written before)."""
        if self._ranges is None:
            self._ranges = replay_offsets(self.path, self.fronts, self.from_slot, self.to_slot)
            starts = next_times(self.path, self._ranges, self.to_slot)
            agent = connect(self.ref)
            # the earliest first: a front alone lets the segment run up to it
            for f, (t, _to) in sorted(starts.items(), key=lambda kv: kv[1][0]):
                ensure_front(agent, f, self.ingest, t)
        return self._ranges

    def initialOffset(self) -> dict[str, int]:
        return {front_key(f): lo for f, (lo, _hi) in self.ranges().items()}

    def latestOffset(self, start: dict[str, int], limit: Any = None) -> dict[str, int]:
        out = {}
        for f, (_lo, hi) in self.ranges().items():
            at = int(start.get(front_key(f), hi))
            out[front_key(f)] = hi if self.max_records is None else min(hi, at + self.max_records)
        return out

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[FrontPartition]:
        ranges = self.ranges()
        out = []
        for k in sorted(end, key=lambda s: int(s[1:])):
            f, lo, hi = int(k[1:]), int(start.get(k, 0)), int(end[k])
            if hi > lo:  # the heartbeat: the next record's time, or the range's end
                beat = self.to_slot if hi >= ranges[f][1] else _time_at(self.path, f, hi)
                out.append(FrontPartition(f, lo, hi, beat))
        return out

    def read(self, partition: FrontPartition) -> Iterator[Any]:
        batch, times, acks = read_log_partition(self.path, partition)
        packed = pack(times, acks, reference_slot(self.ref.grid))
        acc = AckAccumulator()
        acc.add(self.ref.graph.index(self.out), times, ack_ids(packed), +1)
        beat = (Heartbeat(partition.front, int(partition.extra)),)
        sent = submit_task_batch(self.ref, f"<replay>{self.ingest}", partition.front, acc,
                                 beat, owner=source_owner(self.ingest))
        yield attach(batch, packed)
        sent.wait()

    def commit(self, end: dict[str, int]) -> None:
        """A replay is no consumer: it commits nothing, deletes nothing."""


class LogReplaySource(DataSource):  # type: ignore[misc]
    """``spark.readStream.format("lowtide_log_replay")``; see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "lowtide_log_replay"

    def schema(self) -> str:
        from lowtide.spark.sources.log_source import LOG_SCHEMA

        return LOG_SCHEMA

    def streamReader(self, schema: Any) -> LogReplayReader:
        return LogReplayReader({k.lower(): v for k, v in self.options.items()})
