"""Tracked Spark sources (Python Data Source API, micro-batch).

``lowtide_log`` reads the ingest log (:mod:`lowtide.spark.sources.ingest`), one partition per
front. Offsets are ``{"f<front>": next offset}`` and live in Spark's checkpoint, so a
restarted query resumes where it stopped; a re-run batch reads exactly the same records.

A source task is a tracked operator: it *receives* the records from the ingest segment
(where the :class:`lowtide.Front` producer sent them) and *sends* them into the segment
of the first tracked operator, their ack values cut to the tracking column's 32-bit
ids. It sends one idempotent batch, keyed ``(query id, batch id, ingest segment,
front)``, when its output is complete (rule 6).
The producer heartbeats on its own channel after its own acks (rule 3).

A query asks the log's fronts to feed its ingest segment before its first read
(:mod:`~lowtide.spark.sources.joins`) and reads each front from the offset the front
answered: a query attached to a running pipeline reads exactly the records whose acks
the running fronts sent into its segment, and waits for a front that has not joined
it yet.

Notes on the API (PySpark 4.3): the stream reader lives in a separate Python process
next to the driver (not the user's driver process); ``read`` runs in executor tasks;
neither may keep state between calls except through offsets.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.core.acks import root_acks
from lowtide.core.errors import NonMonotonicHeartbeat
from lowtide.core.messages import AckBatch, Heartbeat
from lowtide.spark.sources.front_owner import register_when_free
from lowtide.spark.sources.ingest import IngestReader, list_fronts
from lowtide.spark.sources.joins import request_join, start_offsets
from lowtide.spark.sources.retention import commit_consumer, register_consumer, retain
from lowtide.spark.tracking.column import (
    TRACK_COL,
    AckAccumulator,
    ack_ids,
    attach,
    pack,
    reference_slot,
)
from lowtide.spark.tracking.key_ranges import front_range
from lowtide.spark.tracking.task_errors import answered_within
from lowtide.spark.tracking.transport import (
    AgentLike,
    Pending,
    TrackerRef,
    batch_key,
    connect,
    task_identity,
)

try:  # the module must import without pyspark for the pure tests
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
except ImportError:  # pragma: no cover
    DataSource = DataSourceStreamReader = InputPartition = object  # type: ignore[misc,assignment]

LOG_SCHEMA = f"front int, offset long, payload binary, {TRACK_COL} long"


def front_key(front: int) -> str:
    return f"f{front}"


def parse_fronts(text: str | None) -> list[int] | None:
    """``"0,1,5"`` or ``"0-3"`` -> ids; None/empty/``"auto"``: discover."""
    if not text or text == "auto":
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return sorted(set(out))


def source_owner(segment: str) -> str:
    """The owner name of the fronts a Spark source registers for ``segment``: the
    driver registers them, its tasks heartbeat them (in their keyed batches, rule 3)
    and a restarted driver takes them over, each proving this name (with the secret)."""
    return f"lowtide-spark-source:{segment}"


def ensure_front(agent: AgentLike, front: int, segment: str, time: int) -> None:
    """Register ``front`` at ``time`` unless it is already live further ahead.

    A restarted query says hello again from its checkpoint's offsets; the tracker may
    have seen later heartbeats of the same front (from a batch that ran but was not
    committed), which is fine: the front stays where it is. The owner name makes any
    driver of this pipeline (with its secret) the front's successor (a restart)."""
    try:
        register_when_free(agent, front, segment, time, source_owner(segment))
    except NonMonotonicHeartbeat:
        return


@dataclass(frozen=True)
class TaskBatch:
    """One task's acks (merged per window) on their way to the tracker."""

    acks: AckBatch
    pending: Pending | None  # None: nothing to send (or not confirmed: ref.confirm)
    ref: TrackerRef
    what: str  # the batch, in the one line that says it was not confirmed

    def wait(self) -> None:
        """Block until the tracker confirmed the batch (rule 6: before the task ends);
        :class:`TaskAcksFailed` if it did not within ``ref.wait_s``."""
        if self.pending is not None:
            with answered_within(self.ref, self.what):
                self.pending.wait()


def submit_task_batch(
    ref: TrackerRef,
    segment: str,
    partition: int,
    acc: AckAccumulator,
    heartbeats: Sequence[Heartbeat] = (),
    owner: str | None = None,
) -> TaskBatch:
    """Submit one task's acks (and heartbeats after them) as one idempotent batch,
    without waiting. A task submits once its acks are all known, possibly before its
    last rows are emitted (acks early only keep rows in flight longer), and waits
    before it ends, so the round trip overlaps the emitting. ``owner``: the name the
    heartbeats' fronts were registered with (:func:`source_owner`)."""
    acks = acc.build(ref.grid.window_slots)
    if len(acks) == 0 and not heartbeats:
        return TaskBatch(acks, None, ref, "")
    ident = task_identity()
    key = batch_key(ident.query, ident.batch_id, segment, partition)
    pending = connect(ref).submit_batch(key, acks, tuple(heartbeats), ref.wait_s, owner=owner)
    what = (f"the acks of segment '{segment}' from task {partition} of batch "
            f"{ident.batch_id} of query {ident.query}")
    return TaskBatch(acks, pending if ref.confirm else None, ref, what)


def send_task_batch(
    ref: TrackerRef,
    segment: str,
    partition: int,
    acc: AckAccumulator,
    heartbeats: Sequence[Heartbeat] = (),
) -> AckBatch:
    """:func:`submit_task_batch` and wait; returns the acks (merged per window) sent."""
    batch = submit_task_batch(ref, segment, partition, acc, heartbeats)
    batch.wait()
    return batch.acks


class FrontPartition(InputPartition):  # type: ignore[misc]
    def __init__(self, front: int, start: int, end: int, extra: Any = None) -> None:
        self.front, self.start, self.end, self.extra = front, start, end, extra

    def __repr__(self) -> str:
        return f"FrontPartition(front={self.front}, [{self.start}, {self.end}))"


def log_offsets(
    directory: str, fronts: list[int] | None, start: dict[str, int], max_records: int | None,
    first: dict[int, int | None] | None = None,
) -> dict[str, int]:
    """The next end offsets: everything visible, or at most ``max_records`` per front;
    ``first``: where each front starts for this consumer (None: not yet, it stays)."""
    ids = fronts if fronts is not None else list_fronts(directory)
    end = dict(start)
    for f in ids:
        k = front_key(f)
        begin = 0 if first is None else first.get(f, 0)
        if begin is None:  # the front has not joined this consumer yet
            end[k] = int(start.get(k, 0))
            continue
        lo = max(int(start.get(k, 0)), begin)
        hi = IngestReader(directory, f).end_offset()
        if max_records is not None:
            hi = min(hi, lo + max_records)
        end[k] = max(lo, hi)
    return end


def log_partitions(start: dict[str, int], end: dict[str, int],
                   first: dict[int, int | None] | None = None) -> list[FrontPartition]:
    """One partition per front with records in ``[start, end)``, from where the front
    starts for this consumer (``first``: see :func:`log_offsets`)."""
    out = []
    for k in sorted(end, key=lambda s: int(s[1:])):
        begin = 0 if first is None else first.get(int(k[1:]), 0)
        hi = int(end[k])
        lo = max(int(start.get(k, 0)), hi if begin is None else begin)
        if hi > lo:
            out.append(FrontPartition(int(k[1:]), lo, hi))
    return out


def read_log_partition(
    directory: str, part: FrontPartition
) -> tuple[Any, np.ndarray, np.ndarray]:
    """(record batch of the data columns, times, acks as the front sent them) of the
    partition's records."""
    import pyarrow as pa

    times, payloads = IngestReader(directory, part.front).read(part.start, part.end)
    seq = np.arange(part.start, part.end, dtype=np.uint64)
    acks = root_acks(part.front, seq)
    n = len(seq)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(n, part.front, np.int32)),
            pa.array(seq.astype(np.int64)),
            payloads,
        ],
        names=["front", "offset", "payload"],
    )
    return batch, times, acks


class LogStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]) -> None:
        self.path = options["path"]
        self.fronts = parse_fronts(options.get("fronts"))
        mr = options.get("maxrecordsperbatch")
        self.max_records = int(mr) if mr else None
        self.ref = TrackerRef.from_option(options["lowtide.tracker"])
        self.ingest = options["lowtide.segment"]
        self.out = options["lowtide.out"]
        # each query reading the log is a consumer of its own (retention waits for all)
        self.consumer = options.get("lowtide.consumer") or self.ingest

    def initialOffset(self) -> dict[str, int]:
        ids = self.fronts if self.fronts is not None else list_fronts(self.path)
        register_consumer(self.path, self.consumer, dict.fromkeys(ids, 0))
        request_join(self.path, self.ingest, consumer=self.consumer)
        return {front_key(f): 0 for f in ids}

    def _first(self, fronts: list[int]) -> dict[int, int | None]:
        return start_offsets(self.path, self.ingest, fronts)

    def latestOffset(self, start: dict[str, int], limit: Any = None) -> dict[str, int]:
        ids = self.fronts if self.fronts is not None else list_fronts(self.path)
        return log_offsets(self.path, ids, start, self.max_records, self._first(ids))

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[FrontPartition]:
        return log_partitions(start, end, self._first([int(k[1:]) for k in end]))

    def read(self, partition: FrontPartition) -> Iterator[Any]:
        batch, times, acks = read_log_partition(self.path, partition)
        packed = pack(times, acks, reference_slot(self.ref.grid))
        graph = self.ref.graph
        ingest, out = graph.index(self.ingest), graph.index(self.out)
        r = front_range(graph, self.ingest, partition.front)
        if r is not None:  # its front's key range (rule 15), the next segment split alike
            ingest, out = graph.cell(ingest, r), graph.cell(out, r)
        acc = AckAccumulator()
        acc.add(out, times, ack_ids(packed), +1)  # children first: the acks' low 32 bits
        acc.add(ingest, times, acks, -1)
        sent = submit_task_batch(self.ref, self.ingest, partition.front, acc)
        yield attach(batch, packed)
        sent.wait()

    def commit(self, end: dict[str, int]) -> None:
        """Spark will not read below ``end`` again: record it, and delete the log files
        every consumer has committed."""
        commit_consumer(self.path, self.consumer, {int(k[1:]): int(v) for k, v in end.items()})
        retain(self.path)


class LogSource(DataSource):  # type: ignore[misc]
    """``spark.readStream.format("lowtide_log")``; see :mod:`lowtide.spark.sources.log_source`."""

    @classmethod
    def name(cls) -> str:
        return "lowtide_log"

    def schema(self) -> str:
        return LOG_SCHEMA

    def streamReader(self, schema: Any) -> LogStreamReader:
        return LogStreamReader({k.lower(): v for k, v in self.options.items()})


__all__ = [
    "LOG_SCHEMA",
    "FrontPartition",
    "LogSource",
    "LogStreamReader",
    "ensure_front",
    "log_offsets",
    "log_partitions",
    "parse_fronts",
    "read_log_partition",
    "send_task_batch",
    "source_owner",
    "submit_task_batch",
]
