"""``lowtide.Pipeline``: a tracked streaming pipeline, described like PySpark.

::

    pipe = lowtide.Pipeline(spark, "clicks")               # embedded tracker
    events = pipe.read_log("/data/ingest")                 # or pipe.generate(fronts=4, ...)
    parsed = events.map(parse, "user string, n long", name="parse")
    kept = parsed.filter(lambda b: pc.greater(b["n"], 0), name="positive")
    query = kept.write_parquet("/out", checkpoint="/ckpt")   # starts the query
    query.wait_for_min_time(t)                             # end-to-end completeness
    pipe.close()

The description is lazy: nothing touches Spark until a sink is chosen. Then the
segment graph is derived (one segment per tracked receiver: the source's ingest
segment if it reads a log, one per tracked operator, one for the sink), the tracker
learns it (embedded: started here; remote: ``tracker="tcp://host:port"``, the graph
travels in the handshake), and the DataFrame plan is built with closures that know
the graph.

Segment k holds the rows sent by tracked operator k-1 (or the source) and not yet
received by tracked operator k (or the sink); it is named after its receiver.
Untracked Spark operators (``.transform(fn)``, ``.repartition(n)``) may stand between
tracked ones only if they keep rows 1:1: a row they drop shows up as a stuck window
with missing items in the segment it was sent into, a row they duplicate as extra
items, both with segment, window and count (:meth:`TrackedQuery.stuck`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service.clock import wall_ms
from lowtide.service.progress import RowRates, stalled_fronts
from lowtide.spark.generator import GeneratorSpec, GenSource
from lowtide.spark.operators import OpRuntime, OpSpec, operator_id, task_function
from lowtide.spark.sinks import TrackedForeachBatch, TrackedSink, console_writer
from lowtide.spark.source import LogSource
from lowtide.spark.tracking import TRACK_COL
from lowtide.spark.transport import TrackerRef
from lowtide.spark.windows import WindowSpec, build_window, make_windowed

log = logging.getLogger("lowtide.spark.pipeline")

# ------------------------------------------------------------------ description


@dataclass(frozen=True)
class _Source:
    kind: str  # "log" | "gen"
    name: str | None  # ingest segment name (log) or None (the generator is the front)
    options: dict[str, str]
    spec: GeneratorSpec | None = None


@dataclass(frozen=True)
class _Transform:
    fn: Callable[[Any], Any]


Step = OpSpec | WindowSpec | _Transform


@dataclass(frozen=True)
class Stream:
    """An immutable, lazy description of a tracked stream; methods read like PySpark."""

    pipeline: Pipeline
    steps: tuple[Step, ...] = ()

    def _then(self, step: Step) -> Stream:
        return replace(self, steps=(*self.steps, step))

    def _default_name(self, kind: str) -> str:
        k = sum(isinstance(s, OpSpec | WindowSpec) for s in self.steps) + 1
        return f"{kind}{k}"

    # tracked operators
    def map(
        self, fn: Callable[[Any], Any], schema: Any = None, *, name: str | None = None
    ) -> Stream:
        """Tracked 1:1 map over Arrow batches: ``fn(RecordBatch) -> RecordBatch``."""
        return self._then(OpSpec("map", fn, name or self._default_name("map"), schema))

    def flat_map(self, fn: Callable[[Any], Any], schema: Any, *, name: str | None = None) -> Stream:
        """Tracked 1:N: ``fn(batch) -> (batch, parents)``; see :mod:`.operators`."""
        return self._then(OpSpec("flat_map", fn, name or self._default_name("flat_map"), schema))

    def filter(self, fn: Callable[[Any], Any], *, name: str | None = None) -> Stream:
        """Tracked filter: ``fn(batch) -> boolean mask``."""
        return self._then(OpSpec("filter", fn, name or self._default_name("filter"), None))

    def window(self, size: str | int, *, key: str, slide: str | int | None = None,
               name: str | None = None, poll_ms: int = 100) -> Any:
        """Exact keyed windows over global time (tumbling, or sliding with ``slide``);
        finish with ``.agg(n="count", total=("amount", "sum"))`` or ``.apply(fn,
        schema)``. See :mod:`lowtide.spark.windows`."""
        return make_windowed(self, size, key, slide, name or self._default_name("window"),
                             poll_ms, self.pipeline.grid.delta_ms)

    # untracked, row-preserving
    def transform(self, fn: Callable[[Any], Any]) -> Stream:
        """Apply an untracked DataFrame -> DataFrame function. It must keep rows 1:1
        (and the tracking columns as they are), or the tracker reports the
        difference as missing or extra items."""
        return self._then(_Transform(fn))

    def ends_in_operator(self) -> bool:
        """Is the last step a tracked operator (whose rows reach the sink unchanged)?"""
        return bool(self.steps) and isinstance(self.steps[-1], OpSpec)

    def repartition(self, n: int) -> Stream:
        return self.transform(lambda df: df.repartition(n))

    # sinks (each starts the query)
    def foreach_batch(
        self,
        fn: Callable[[Any, int], Any],
        *,
        checkpoint: str,
        name: str = "sink",
        keep_tracking_columns: bool = False,
        trigger: str | None = None,
        query_name: str | None = None,
    ) -> TrackedQuery:
        """``fn(df, batch_id)`` commits the batch; receipt is acked after it returns."""
        return self.pipeline._start(
            self, ("foreach", fn, keep_tracking_columns, None), name, checkpoint, trigger,
            query_name,
        )

    def to_console(
        self, *, checkpoint: str, name: str = "sink", num_rows: int = 20, trigger: str | None = None
    ) -> TrackedQuery:
        return self.foreach_batch(
            console_writer(num_rows), checkpoint=checkpoint, name=name, trigger=trigger
        )

    def write_parquet(
        self,
        path: str,
        *,
        checkpoint: str,
        name: str = "sink",
        keep_tracking_columns: bool = False,
        trigger: str | None = None,
        query_name: str | None = None,
    ) -> TrackedQuery:
        """Parquet files ``part-<batch>-<partition>.parquet`` under ``path``, published
        by the driver-side commit; acked after publication."""
        options = {"mode": "parquet", "path": path,
                   "keepTrackingColumns": str(keep_tracking_columns).lower()}
        return self.pipeline._start(
            self, ("writer", options), name, checkpoint, trigger, query_name
        )

    def to_null(
        self, *, checkpoint: str, name: str = "sink", trigger: str | None = None,
        query_name: str | None = None, trace_file: str | None = None,
    ) -> TrackedQuery:
        """Drop the rows. Ending in a tracked operator, the query writes to Spark's
        ``noop`` sink and each task of the operator acks its rows as received by the
        sink right after its own batch (it hands them to the sink in the same task, and
        nothing is committed), so the sink costs nothing; otherwise a ``foreachBatch``
        acks the rows from one aggregation job per batch in the JVM (no Python pass),
        after the rows' untracked steps ran.
        ``trace_file``: whoever acks the sink appends ``<batch> <ack start ns> <acks
        confirmed ns> <rows>`` (the operator's tasks: one line per task attempt)."""
        return self.pipeline._start(
            self, ("foreach", None, False, trace_file), name, checkpoint, trigger, query_name
        )

    # introspection
    def segment_names(self, sink: str = "sink") -> list[str]:
        src = self.pipeline._source
        names = [src.name] if src is not None and src.name else []
        for s in self.steps:
            if isinstance(s, OpSpec):
                names.append(s.name)
            elif isinstance(s, WindowSpec):  # inbound, then state (holds, rule 7)
                names += s.segments()
        return [*names, sink]

    def graph(self, sink: str = "sink") -> SegmentGraph:
        names = self.segment_names(sink)
        return SegmentGraph.of(*[(n, (names[i - 1],) if i else ()) for i, n in enumerate(names)])


# ------------------------------------------------------------------ tracker handle


class TrackerHandle:
    """The tracker a pipeline reports to: embedded (started here) or remote."""

    def __init__(
        self,
        graph: SegmentGraph,
        grid: TimeGrid,
        url: str | None,
        secret: str | None,
        state_dir: str | None,
        stuck_after_ms: int,
        freeze_gc: bool = True,
        confirm: bool = True,
    ) -> None:
        self.graph, self.grid, self.secret = graph, grid, secret
        self.service: Any = None
        if url is None:
            from lowtide.service import TrackerService

            kwargs: dict[str, Any] = {
                "grid": grid,
                "state_dir": state_dir,
                "secret": secret.encode() if secret is not None else None,
                "freeze_gc": freeze_gc,
            }
            if stuck_after_ms is not None:
                kwargs["stuck_after_ms"] = stuck_after_ms
            self.service = TrackerService.start(graph, **kwargs)
            url = self.service.url
        self.url: str = url  # type: ignore[assignment]
        self.ref = TrackerRef(self.url, graph, grid, secret, confirm)
        self._agent: Any = None

    @property
    def agent(self) -> Any:
        if self._agent is None:
            from lowtide.spark.transport import connect

            self._agent = connect(self.ref)
        return self._agent

    def status(self) -> dict[str, Any]:
        return dict(self.agent.status())

    def subscribe(self, segment: str | None) -> Iterator[Any]:
        it: Iterator[Any] = self.agent.subscribe(segment)
        return it

    def close(self) -> None:
        """Close this process's agent for the tracker, then stop an embedded tracker."""
        if self._agent is not None:
            close = getattr(self._agent, "close", None)
            if close is not None:
                close()
            self._agent = None
        if self.service is not None:
            self.service.stop()
            self.service = None


# ------------------------------------------------------------------ progress


@dataclass
class SegmentProgress:
    segment: str
    min_time: int
    lag_ms: int | None
    rows_per_s: float | None
    in_flight: int | None = None
    bound: int | None = None


@dataclass
class PipelineStatus:
    wall_ms: int
    global_min: int
    segments: list[SegmentProgress]
    fronts: dict[str, Any] = field(default_factory=dict)
    stalled_fronts: list[int] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)

    def render(self, delta_ms: int) -> str:
        lines = [f"{'segment':<16} {'min time':>14} {'lag ms':>9} {'rows/s':>10} {'in flight':>9}"]
        for s in self.segments:
            lag = "-" if s.lag_ms is None else str(s.lag_ms)
            rps = "-" if s.rows_per_s is None else f"{s.rows_per_s:.0f}"
            fl = "-" if s.in_flight is None else str(s.in_flight)
            lines.append(f"{s.segment:<16} {s.min_time:>14} {lag:>9} {rps:>10} {fl:>9}")
        for f, (seg, t) in sorted(self.fronts.items(), key=lambda kv: int(kv[0])):
            flag = "  STALLED" if int(f) in self.stalled_fronts else ""
            lag = self.wall_ms - t * delta_ms
            lines.append(f"front {f:<10} {seg:<8} heartbeat lag {lag} ms{flag}")
        lines.extend(f"STUCK: {s}" for s in self.stuck)
        return "\n".join(lines)


def stop_between_batches(query: Any, graceful_s: float = 10.0) -> None:
    """Stop a streaming query between batches if one ends within ``graceful_s``:
    PySpark 4.3's stop during a Python task can kill the stream thread with a
    StackOverflowError (a regex over the interrupted task's long error message), and
    it aborts the batch's writes noisily."""
    deadline = time.monotonic() + graceful_s
    while query.isActive and query.status.get("isTriggerActive", False):
        if time.monotonic() > deadline:
            break
        time.sleep(0.005)
    query.stop()
    await_jobs_gone(str(query.runId))


def await_jobs_gone(job_group: str, timeout_s: float = 30.0) -> bool:
    """Return once no task of ``job_group``'s jobs (a query run's id) is running,
    cancelling the group again while one is. Spark marks a stopped query's jobs
    cancelled at once, but their tasks end later; CI once showed a stopped query's
    stage still running, its tasks blocked on the tracker that was closed next.
    True if none is left within ``timeout_s``."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        return True
    deadline = time.monotonic() + timeout_s
    while _active_tasks(sc.statusTracker(), job_group):
        if time.monotonic() > deadline:
            log.warning("tasks still running after the query stopped", extra={"group": job_group})
            return False
        sc.cancelJobGroup(job_group)
        time.sleep(0.1)
    return True


def _active_tasks(tracker: Any, job_group: str) -> int:
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(job_group)]
    stages = [tracker.getStageInfo(s) for j in jobs if j is not None for s in j.stageIds]
    return sum(st.numActiveTasks for st in stages if st is not None)


def status_of(doc: dict[str, Any], grid: TimeGrid, rates: RowRates | None = None,
              stall_after_ms: int = 2_000) -> PipelineStatus:
    """A :class:`PipelineStatus` from the tracker's status document. Rows/s per segment
    come from the tracker's cumulative ``received`` count of each segment."""
    now = int(doc.get("now_ms") or wall_ms())
    segs = []
    for s in doc.get("segments", []):
        lag = now - s["min_time"] * grid.delta_ms if s["min_time"] > 0 else None
        rps = None
        total = s.get("received")
        if rates is not None and total is not None:
            rps = rates.observe(s["segment"], time.monotonic(), int(total))
        segs.append(SegmentProgress(s["segment"], s["min_time"], lag, rps,
                                    s.get("in_flight"), s.get("bound")))
    fronts = doc.get("fronts", {})
    stalled = stalled_fronts(fronts, now, grid, stall_after_ms)
    return PipelineStatus(now, doc.get("global_min", 0), segs, fronts, sorted(stalled),
                          list(doc.get("stuck", [])))


# ------------------------------------------------------------------ pipeline


_REGISTERED: set[int] = set()
_REG_LOCK = threading.Lock()


def register_sources(spark: Any) -> None:
    """Register lowtide's Python data sources with ``spark`` (once per session)."""
    with _REG_LOCK:
        if id(spark) in _REGISTERED:
            return
        for ds in (LogSource, GenSource, TrackedSink):
            spark.dataSource.register(ds)
        _REGISTERED.add(id(spark))


def _with_tracking(schema: Any) -> Any:
    from pyspark.sql.types import LongType, StructField, StructType

    if isinstance(schema, str):
        return f"{schema}, {TRACK_COL} long"
    if isinstance(schema, StructType):
        return StructType([*schema.fields, StructField(TRACK_COL, LongType(), False)])
    raise TypeError(f"schema must be a DDL string or StructType, got {type(schema)}")


@dataclass(frozen=True)
class Built:
    """A built pipeline: the streaming DataFrame (up to the sink), its graph and
    tracker."""

    df: Any
    graph: SegmentGraph
    ref: TrackerRef


class Pipeline:
    """A tracked PySpark streaming pipeline; see the module docstring.

    ``tracker``: None to embed a tracker service in this process, or
    ``"tcp://host:port"`` of a running ``lowtide serve`` (``secret``: its shared secret).
    ``freeze_gc``: when the embedded tracker starts, ``gc.freeze()`` the objects alive
    in this process, so Python's full collections (which stall the tracker's thread
    with the rest of the process) scan only objects made later; see docs/spark.md.
    ``confirm=False`` is for measuring only: tasks submit their ack batches and end
    without waiting for the tracker's confirmation, which breaks rule 6 (a worker that
    dies right after its task loses the task's acks, and their windows stay stuck).
    ``lowtide bench spark --variants tracked-unconfirmed`` measures what the wait costs.
    """

    def __init__(
        self,
        spark: Any,
        name: str = "lowtide",
        *,
        tracker: str | None = None,
        secret: str | None = None,
        grid: TimeGrid | None = None,
        state_dir: str | None = None,
        stuck_after_ms: int = 5_000,
        freeze_gc: bool = True,
        confirm: bool = True,
    ) -> None:
        self.spark = spark
        self.name = name
        self.grid = grid or TimeGrid()
        self._tracker_url = tracker
        self._secret = secret if secret is not None else os.environ.get("LOWTIDE_SECRET")
        self._state_dir = state_dir
        self._stuck_after_ms = stuck_after_ms
        self._freeze_gc = freeze_gc
        self._confirm = confirm
        self._source: _Source | None = None
        self._graph: SegmentGraph | None = None
        self._handle: TrackerHandle | None = None
        self._queries: list[TrackedQuery] = []
        self._rates = RowRates()

    # sources
    def read_log(
        self, path: str, *, fronts: str | list[int] | None = None, name: str = "ingest",
        max_records_per_batch: int | None = None,
    ) -> Stream:
        """The ingest log written by :class:`lowtide.Front` producers; one partition
        per front. ``name`` is the ingest segment (the fronts' source segment)."""
        opts = {"path": os.fspath(path)}
        if fronts is not None:
            opts["fronts"] = fronts if isinstance(fronts, str) else ",".join(map(str, fronts))
        if max_records_per_batch is not None:
            opts["maxRecordsPerBatch"] = str(max_records_per_batch)
        return self._set_source(_Source("log", name, opts))

    def generate(self, spec: GeneratorSpec | None = None, **kwargs: Any) -> Stream:
        """The generator source (see :class:`GeneratorSpec` for ``kwargs``)."""
        spec = spec or GeneratorSpec(**kwargs)
        return self._set_source(_Source("gen", None, {"spec": spec.to_json()}, spec))

    def _set_source(self, src: _Source) -> Stream:
        if self._source is not None:
            raise ValueError("a Pipeline has one source (build another Pipeline for more)")
        self._source = src
        return Stream(self)

    # tracker
    def describe(self, stream: Stream, sink: str = "sink") -> SegmentGraph:
        return stream.graph(sink)

    def start_tracker(self, graph: SegmentGraph) -> TrackerHandle:
        """Start (embedded) or reach (remote) the tracker for ``graph``; idempotent."""
        if self._handle is not None:
            if self._handle.graph != graph:
                raise ValueError("this pipeline's tracker already tracks another graph")
            return self._handle
        self._graph = graph
        self._handle = TrackerHandle(graph, self.grid, self._tracker_url, self._secret,
                                     self._state_dir, self._stuck_after_ms, self._freeze_gc,
                                     self._confirm)
        return self._handle

    @property
    def tracker(self) -> TrackerHandle:
        if self._handle is None:
            raise RuntimeError("the tracker starts with the query (or start_tracker(graph))")
        return self._handle

    @property
    def tracker_ref(self) -> TrackerRef:
        return self.tracker.ref

    def front(self, front: int, log_dir: str | None = None, **kwargs: Any) -> Any:
        """A :class:`lowtide.Front` producer feeding this pipeline's ingest log."""
        from lowtide.spark.front import Front

        src = self._source
        if src is None or src.kind != "log":
            raise ValueError("fronts feed pipelines that read_log()")
        return Front(log_dir or src.options["path"], front, self.tracker_ref,
                     segment=src.name or "ingest", **kwargs)

    # running
    def build(self, stream: Stream, sink_name: str = "sink", null_sink: bool = False,
              trace_file: str | None = None) -> Built:
        """Start the tracker and build the streaming DataFrame of ``stream`` (tracking
        columns included), for a sink that the caller writes and acks itself.
        ``null_sink``: the rows go to Spark's ``noop`` sink and the last step, which
        must be a tracked operator, acks them as received there (``trace_file``: see
        :meth:`Stream.to_null`; a path every executor can append to)."""
        src = self._source
        assert src is not None
        if null_sink and not stream.ends_in_operator():
            raise ValueError("the null sink acks from the last step: a tracked operator")
        graph = stream.graph(sink_name)
        handle = self.start_tracker(graph)
        ref = handle.ref
        register_sources(self.spark)
        names = stream.segment_names(sink_name)
        first_out = names[1] if src.kind == "log" else names[0]
        opts = dict(src.options)
        opts["lowtide.tracker"] = ref.to_option()
        if src.kind == "log":
            opts["lowtide.segment"] = src.name or "ingest"
            opts["lowtide.out"] = first_out
            df = self.spark.readStream.format("lowtide_log").options(**opts).load()
        else:
            opts["lowtide.segment"] = first_out
            df = self.spark.readStream.format("lowtide_gen").options(**opts).load()
        # segment after op k is the next receiver's name
        ops = [s for s in stream.steps if isinstance(s, OpSpec | WindowSpec)]
        op_names = [o.name for o in ops]
        after: dict[str, str] = {
            n: (op_names[i + 1] if i + 1 < len(op_names) else sink_name)
            for i, n in enumerate(op_names)
        }
        for step in stream.steps:
            if isinstance(step, _Transform):
                df = step.fn(df)
                continue
            if isinstance(step, WindowSpec):
                df = build_window(df, step, ref, after[step.name], operator_id(step.name))
                continue
            last = null_sink and step is stream.steps[-1]
            rt = OpRuntime(step.kind, step.fn, ref, step.name, after[step.name],
                           operator_id(step.name), last, trace_file if last else None)
            schema = df.schema if step.kind == "filter" or step.schema is None else \
                _with_tracking(step.schema)
            df = df.mapInArrow(task_function(rt), schema)
        return Built(df, graph, ref)

    def _start(self, stream: Stream, sink: tuple[Any, ...], sink_name: str, checkpoint: str,
               trigger: str | None, query_name: str | None) -> TrackedQuery:
        null_sink = sink[0] == "foreach" and sink[1] is None and stream.ends_in_operator()
        built = self.build(stream, sink_name, null_sink, sink[3] if null_sink else None)
        df, graph, ref = built.df, built.graph, built.ref
        writer = df.writeStream.option("checkpointLocation", checkpoint)
        if trigger:
            writer = writer.trigger(processingTime=trigger)
        if query_name:
            writer = writer.queryName(query_name)
        if null_sink:
            query = writer.format("noop").start()
        elif sink[0] == "foreach":
            fb = TrackedForeachBatch(sink[1], ref, sink_name, keep_tracking_columns=sink[2],
                                     trace_file=sink[3])
            query = writer.foreachBatch(fb).start()
        else:
            opts = dict(sink[1])
            opts["lowtide.tracker"] = ref.to_option()
            opts["lowtide.segment"] = sink_name
            query = writer.format("lowtide_sink").options(**opts).start()
        tq = TrackedQuery(self, query, graph)
        self._queries.append(tq)
        return tq

    def status(self) -> PipelineStatus:
        return status_of(self.tracker.status(), self.grid, self._rates)

    def close(self) -> None:
        """Stop this pipeline's queries and its embedded tracker."""
        for q in self._queries:
            q.stop()
        self._queries.clear()
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class TrackedQuery:
    """A running tracked query: Spark's ``StreamingQuery`` plus the tracker's view."""

    def __init__(self, pipeline: Pipeline, query: Any, graph: SegmentGraph) -> None:
        self.pipeline = pipeline
        self.query = query
        self.graph = graph
        self.sink = graph.names[-1]

    @property
    def id(self) -> str:
        return str(self.query.id)

    def status(self) -> PipelineStatus:
        return self.pipeline.status()

    def min_time(self, segment: str | None = None) -> int:
        doc = self.pipeline.tracker.status()
        if segment is None:
            return int(doc["global_min"])
        return next(int(s["min_time"]) for s in doc["segments"] if s["segment"] == segment)

    def stuck(self) -> list[str]:
        return list(self.pipeline.tracker.status().get("stuck", []))

    def wait_for_min_time(self, time_slot: int, segment: str | None = None,
                          timeout_s: float = 60.0) -> int:
        """Block until ``segment`` (default: the sink) passes ``time_slot``."""
        seg = segment or self.sink
        deadline = time.monotonic() + timeout_s
        while True:
            t = self.min_time(seg)
            if t >= time_slot:
                return t
            if self.query.exception() is not None:
                raise RuntimeError(f"query failed: {self.query.exception()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{seg!r} at {t}, waited for {time_slot}; stuck: {self.stuck()}")
            time.sleep(0.05)

    def stop(self, *, graceful_s: float = 10.0) -> None:
        stop_between_batches(self.query, graceful_s)
