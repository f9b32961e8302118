"""A generator source for demos, tests and benchmarks: ``format("lowtide_gen")``.

N fronts produce rows at a total ``rate`` (rows/s), split by ``skew`` (front f gets a
share proportional to ``(f + 1) ** -skew``). Row ``seq`` of front ``f`` is labelled at
``t0 + floor(seq * 1000 / rate_f)`` ms: times, payloads and ack values are pure
functions of ``(front, seq)`` (rule 5), so a retried or re-run batch yields the same
rows and acks.

The source task *is* the front: each task sends its rows' send-acks into the first
segment and then the front's heartbeat, in one idempotent batch (rules 3 and 6). With
``tasks=n`` a task reads several fronts, each still sending its own batch. An
offset carries, per front, the next seq and the heartbeat (a slot); it advances every
trigger even when no row is due, so an idle front keeps heartbeating.

A *lagging* front's rows reach Spark ``lag_ms`` after they are labelled (and its
heartbeat lags as much). A *stalled* front stops at ``after_ms`` (relative to t0) for
``for_ms`` (None: forever): no rows, no heartbeats, until it resumes with its backlog.

t0 is ``spec.t0_ms`` when given, else the wall clock when the query's reader makes
its initial offset. With ``t0_ms`` fixed, every stream of the same spec serves the
same rows (front, seq, time, payload) on the same wall-clock schedule, whenever its
query starts: two queries, or a query and a batch recomputation, see the same events.

>>> spec = GeneratorSpec(fronts=2, rate=300.0, skew=1.0)
>>> [round(r) for r in spec.rates()]
[200, 100]
>>> plan = plan_front(spec, front=0, t0=1_000, now_ms=1_100, start_seq=0, start_hb=100)
>>> plan.seq, plan.hb   # 21 rows labelled in [1000, 1100] ms, heartbeat slot 110
(21, 110)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from lowtide.core.acks import root_acks
from lowtide.core.messages import Heartbeat
from lowtide.core.time import TimeGrid
from lowtide.service.clock import wall_ms
from lowtide.spark.sources.log_source import (
    FrontPartition,
    TaskBatch,
    ensure_front,
    front_key,
    source_owner,
    submit_task_batch,
)
from lowtide.spark.tracking.column import (
    TRACK_COL,
    AckAccumulator,
    ack_ids,
    attach,
    pack,
    reference_slot,
)
from lowtide.spark.tracking.key_ranges import front_cell
from lowtide.spark.tracking.transport import TrackerRef, connect

try:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
except ImportError:  # pragma: no cover
    DataSource = DataSourceStreamReader = InputPartition = object  # type: ignore[misc,assignment]

DEFAULT_GRID = TimeGrid()
UNTRACKED_SCHEMA = "front int, seq long, event_ms long, payload binary"
GEN_SCHEMA = f"{UNTRACKED_SCHEMA}, {TRACK_COL} long"


@dataclass(frozen=True)
class GeneratorSpec:
    fronts: int = 4
    rate: float = 1_000.0
    payload_bytes: int = 16
    skew: float = 0.0
    #: front -> lag in ms
    lag_ms: dict[int, int] = field(default_factory=dict)
    #: front -> (stall after ms since t0, stall duration ms or None for ever)
    stall: dict[int, tuple[int, int | None]] = field(default_factory=dict)
    max_rows_per_batch: int | None = None
    first_front: int = 0
    #: stop producing rows (heartbeats go on) after this many rows per front
    rows_per_front: int | None = None
    #: epoch ms of row 0 of every front; None: the reader's clock at its initial offset
    t0_ms: int | None = None
    #: tasks that read the fronts each micro-batch (front i in task i % tasks); 0: one
    #: task per front. Recorded in the initial offset: a re-run batch keeps its grouping
    tasks: int = 0

    def __post_init__(self) -> None:
        if self.tasks < 0:
            raise ValueError(f"GeneratorSpec(tasks={self.tasks}): tasks must be 0 (a task "
                             "per front) or a positive number of tasks")

    def front_ids(self) -> list[int]:
        return list(range(self.first_front, self.first_front + self.fronts))

    def rates(self) -> list[float]:
        weights = [(i + 1) ** -self.skew for i in range(self.fronts)]
        total = sum(weights)
        return [self.rate * w / total for w in weights]

    def rate_of(self, front: int) -> float:
        return self.rates()[front - self.first_front]

    def start_ms(self, now_ms: int) -> int:
        """t0 of a stream whose reader starts at ``now_ms``.

        >>> GeneratorSpec(t0_ms=5_000).start_ms(9_000), GeneratorSpec().start_ms(9_000)
        (5000, 9000)
        """
        return now_ms if self.t0_ms is None else self.t0_ms

    def to_json(self) -> str:
        doc = asdict(self)
        doc["lag_ms"] = {str(k): v for k, v in self.lag_ms.items()}
        doc["stall"] = {str(k): list(v) for k, v in self.stall.items()}
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> GeneratorSpec:
        doc = json.loads(text)
        doc["lag_ms"] = {int(k): int(v) for k, v in doc["lag_ms"].items()}
        doc["stall"] = {int(k): (int(v[0]), v[1]) for k, v in doc["stall"].items()}
        return cls(**doc)


def label_ms(t0: int, rate: float, seq: np.ndarray) -> np.ndarray:
    """When rows ``seq`` of a front with ``rate`` rows/s are labelled (int64 ms)."""
    if rate <= 0:
        return np.full(len(seq), np.iinfo(np.int64).max // 4, np.int64)
    return t0 + np.floor(np.asarray(seq, np.float64) * (1000.0 / rate)).astype(np.int64)


def rows_before(t0: int, rate: float, ms: int) -> int:
    """How many rows are labelled at or before ``ms``."""
    if rate <= 0 or ms < t0:
        return 0
    # rows labelled before ms + 1; counting only those before ms left the loops below a
    # millisecond's worth of rows to walk one by one (2 ms a call at a million rows/s)
    n = math.ceil((ms - t0 + 1) * rate / 1000.0)
    # correct float edge cases against label_ms itself
    while n > 0 and int(label_ms(t0, rate, np.array([n - 1]))[0]) > ms:
        n -= 1
    while int(label_ms(t0, rate, np.array([n]))[0]) <= ms:
        n += 1
    return n


def available_ms(spec: GeneratorSpec, front: int, t0: int, now_ms: int) -> int:
    """Up to which label time the front's rows have reached Spark at ``now_ms``."""
    avail = now_ms - spec.lag_ms.get(front, 0)
    stall = spec.stall.get(front)
    if stall is not None:
        after, duration = stall
        begins = t0 + after
        if now_ms >= begins and (duration is None or now_ms < begins + duration):
            avail = min(avail, begins)
    return avail


@dataclass(frozen=True)
class FrontPlan:
    seq: int
    hb: int


def plan_front(
    spec: GeneratorSpec,
    front: int,
    t0: int,
    now_ms: int,
    start_seq: int,
    start_hb: int,
    grid: TimeGrid = DEFAULT_GRID,
) -> FrontPlan:
    """Next (end seq, heartbeat slot) of ``front``: monotonic, and the heartbeat never
    passes the label of the next row."""
    rate = spec.rate_of(front)
    avail = available_ms(spec, front, t0, now_ms)
    end = max(start_seq, rows_before(t0, rate, avail))
    if spec.max_rows_per_batch is not None:
        end = min(end, start_seq + spec.max_rows_per_batch)
    if spec.rows_per_front is not None:
        end = min(end, max(start_seq, spec.rows_per_front))
    hb = grid.slot_of(avail)
    if spec.rows_per_front is None or end < spec.rows_per_front:
        next_label = int(label_ms(t0, rate, np.array([end]))[0])
        hb = min(hb, grid.slot_of(next_label))
    return FrontPlan(end, max(hb, start_hb))


def initial_offset(spec: GeneratorSpec, t0: int, grid: TimeGrid) -> dict[str, Any]:
    hb = grid.slot_of(t0)
    out: dict[str, Any] = {"t0": t0}
    if spec.tasks:
        out["tasks"] = spec.tasks
    for f in spec.front_ids():
        out[front_key(f)] = {"seq": 0, "hb": hb}
    return out


def next_offset(
    spec: GeneratorSpec, start: dict[str, Any], now_ms: int, grid: TimeGrid
) -> dict[str, Any]:
    t0 = int(start["t0"])
    out: dict[str, Any] = {"t0": t0}
    if "tasks" in start:
        out["tasks"] = int(start["tasks"])
    for f in spec.front_ids():
        cur = start.get(front_key(f), {"seq": 0, "hb": grid.slot_of(t0)})
        plan = plan_front(spec, f, t0, now_ms, int(cur["seq"]), int(cur["hb"]), grid)
        out[front_key(f)] = {"seq": plan.seq, "hb": plan.hb}
    return out


class FrontsPartition(InputPartition):  # type: ignore[misc]
    """The fronts one task reads (``GeneratorSpec.tasks``), each as its own
    :class:`FrontPartition`: its acks stay one keyed batch per front."""

    def __init__(self, parts: tuple[FrontPartition, ...]) -> None:
        self.parts = parts

    def __repr__(self) -> str:
        return f"FrontsPartition({list(self.parts)})"


def gen_partitions(start: dict[str, Any], end: dict[str, Any]
                   ) -> list[FrontPartition] | list[FrontsPartition]:
    """The fronts with rows or a heartbeat between the offsets: one partition each,
    or, with ``tasks`` in the offset, front ``i`` (by position) in partition
    ``i % tasks`` (a partition with no front left out)."""
    out = []
    t0 = int(end["t0"])
    keys = sorted((k for k in end if k.startswith("f")), key=lambda s: int(s[1:]))
    tasks = int(end.get("tasks", 0))
    groups: list[list[FrontPartition]] = [[] for _ in range(tasks)]
    for i, k in enumerate(keys):
        a, b = start.get(k, {"seq": 0, "hb": 0}), end[k]
        if b["seq"] > a["seq"] or b["hb"] > a["hb"]:
            part = FrontPartition(int(k[1:]), int(a["seq"]), int(b["seq"]), (t0, b["hb"]))
            (groups[i % tasks] if tasks else out).append(part)
    return [FrontsPartition(tuple(g)) for g in groups if g] if tasks else out


def gen_rows(
    spec: GeneratorSpec, part: FrontPartition, grid: TimeGrid, tracked: bool = True
) -> tuple[Any, np.ndarray, np.ndarray]:
    """(record batch of the data columns, times, acks) of a partition's rows; not
    ``tracked`` (the benchmarks' untracked queries): no acks (an empty array), so an
    untracked query pays nothing of tracking."""
    import pyarrow as pa

    t0 = part.extra[0]
    seq = np.arange(part.start, part.end, dtype=np.uint64)
    n = len(seq)
    ms = label_ms(t0, spec.rate_of(part.front), seq)
    times = ms // grid.delta_ms
    acks = root_acks(part.front, seq) if tracked else np.empty(0, np.uint64)
    size = spec.payload_bytes
    offsets = (np.arange(n + 1, dtype=np.int64) * size).astype(np.int32)
    data = np.empty(n * size, np.uint8)
    if size:
        data.reshape(n, size)[:] = (seq.astype(np.uint8))[:, None]
    payload = pa.BinaryArray.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data.tobytes())]
    )
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(n, part.front, np.int32)),
            pa.array(seq.astype(np.int64)),
            pa.array(ms),
            payload,
        ],
        names=["front", "seq", "event_ms", "payload"],
    )
    return batch, times, acks


class GenStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    """``tracking=false`` (benchmarks): the same rows without tracking columns, no acks,
    no heartbeats, no tracker."""

    def __init__(self, options: dict[str, str]) -> None:
        self.spec = GeneratorSpec.from_json(options["spec"])
        self.tracking = options.get("tracking", "true").lower() != "false"
        if self.tracking:
            self.ref = TrackerRef.from_option(options["lowtide.tracker"])
            self.segment = options["lowtide.segment"]
            self.grid = self.ref.grid
        else:
            self.grid = TimeGrid(int(options.get("delta_ms", DEFAULT_GRID.delta_ms)))
        self._registered = False

    def _register(self, start: dict[str, Any]) -> None:
        if self._registered or not self.tracking:
            return
        agent = connect(self.ref)
        t0 = int(start["t0"])
        for f in self.spec.front_ids():
            hb = int(start.get(front_key(f), {"hb": self.ref.grid.slot_of(t0)})["hb"])
            ensure_front(agent, f, self.segment, hb)
        self._registered = True

    def initialOffset(self) -> dict[str, Any]:
        return initial_offset(self.spec, self.spec.start_ms(wall_ms()), self.grid)

    def latestOffset(self, start: dict[str, Any], limit: Any = None) -> dict[str, Any]:
        self._register(start)
        return next_offset(self.spec, start, wall_ms(), self.grid)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> list[FrontPartition] | list[FrontsPartition]:
        # a restarted query may re-run its last logged batch without latestOffset
        self._register(start)
        return gen_partitions(start, end)

    def read(self, partition: FrontPartition | FrontsPartition) -> Iterator[Any]:
        batches, submit = self.prepared(partition)
        sent = submit()  # before the rows go: the round trip overlaps their emitting
        yield from batches
        for batch in sent:
            batch.wait()

    def prepared(self, partition: FrontPartition | FrontsPartition
                 ) -> tuple[list[Any], Callable[[], list[TaskBatch]]]:
        """A partition's record batches, and what submits every front's keyed batch
        (rules 3 and 6), returning them unconfirmed: the task waits for them before it
        ends. A window that receives in this task submits them with its receipts and
        its stamp's question, in one write (:func:`lowtide.spark.tracking.receive.
        stamped`)."""
        parts = partition.parts if isinstance(partition, FrontsPartition) else (partition,)
        fronts = [(p, *self._front(p)) for p in parts]

        def submit() -> list[TaskBatch]:
            if not self.tracking:
                return []
            # key namespace "<source>": the first operator's tasks key on the same segment
            return [submit_task_batch(self.ref, f"<source>{self.segment}", part.front, acc,
                                      (Heartbeat(part.front, int(part.extra[1])),),
                                      owner=source_owner(self.segment))
                    for part, _, acc in fronts]

        return [batch for _, batch, _ in fronts if batch.num_rows], submit

    def _front(self, part: FrontPartition) -> tuple[Any, AckAccumulator]:
        """A front's rows (tracked: with ``lt_track``) and their send-acks (untracked:
        none)."""
        batch, times, acks = gen_rows(self.spec, part, self.grid, self.tracking)
        acc = AckAccumulator()
        if not self.tracking:
            return batch, acc
        packed = pack(times, acks, reference_slot(self.grid))
        acc.add(front_cell(self.ref.graph, self.segment, part.front), times,
                ack_ids(packed), +1)
        return attach(batch, packed), acc

    def commit(self, end: dict[str, Any]) -> None:
        return None


class GenSource(DataSource):  # type: ignore[misc]
    @classmethod
    def name(cls) -> str:
        return "lowtide_gen"

    def schema(self) -> str:
        untracked = str(self.options.get("tracking", "true")).lower() == "false"
        return UNTRACKED_SCHEMA if untracked else GEN_SCHEMA

    def streamReader(self, schema: Any) -> GenStreamReader:
        return GenStreamReader({k.lower(): v for k, v in self.options.items()})
