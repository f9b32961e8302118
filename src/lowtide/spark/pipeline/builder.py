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
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lowtide.core.errors import LowtideError
from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service.progress import RowRates
from lowtide.spark.operators.joins import JoinSpec, join_input
from lowtide.spark.operators.speculative_plan import SPECULATIVE_CONFS, update_mode
from lowtide.spark.operators.tracked import OpSpec
from lowtide.spark.operators.window_plan import WATERMARK_CONFS, QueryWindows, session_confs
from lowtide.spark.pipeline.batches import BatchReporter, announce_queries
from lowtide.spark.pipeline.dag import (
    PipelineShapeError,
    SegmentPlan,
    covers,
    derive,
    refuse_fan_out,
    source_key,
)
from lowtide.spark.pipeline.data_sources import register_sources
from lowtide.spark.pipeline.describe import described
from lowtide.spark.pipeline.handle import TrackerHandle, TrackerOptions, operating_options
from lowtide.spark.pipeline.monitoring import ProgressMetrics
from lowtide.spark.pipeline.query import TrackedQuery, startup_phase
from lowtide.spark.pipeline.repair import Repaired, repair
from lowtide.spark.pipeline.replay import Loss, Replayed, losses_of, replay
from lowtide.spark.pipeline.sources import DeclaredFronts, SourceSpec, declare_fronts
from lowtide.spark.pipeline.status import PipelineStatus, status_of
from lowtide.spark.pipeline.step_plans import (
    Targets,
    ends_in_arrow_map,
    fixed_plan_confs,
    plan_steps,
    read_source,
    union_by_name,
)
from lowtide.spark.pipeline.stream import Stream
from lowtide.spark.pipeline.stream_sinks import sink_function
from lowtide.spark.sources.generator import GeneratorSpec
from lowtide.spark.sources.joins import release_join
from lowtide.spark.sources.log_source import parse_fronts
from lowtide.spark.sources.read_stream import check_labelled, entry_of
from lowtide.spark.sources.retention import release_consumer
from lowtide.spark.tracking.transport import HOLD_WAIT_S, TrackerRef


@dataclass(frozen=True)
class Built:
    """A built pipeline: the streaming DataFrame (up to the sink), its graph and
    tracker; ``holds``: the holds of its windows planned in the JVM, which its query
    moves (:mod:`lowtide.spark.operators.window_hold`); ``changelog``: the changelog
    step its sink's ``foreachBatch`` runs first, if any
    (:mod:`lowtide.spark.operators.speculative_driver`); ``update``: its query runs in
    update mode (:func:`lowtide.spark.operators.speculative_plan.update_mode`)."""

    df: Any
    graph: SegmentGraph
    ref: TrackerRef
    holds: tuple[Any, ...] = ()
    changelog: Any = None
    update: bool = False


class TrackerNotStarted(LowtideError, RuntimeError):
    """The pipeline's tracker was asked for before a query (or start_tracker) began."""


class Pipeline:
    """A tracked PySpark streaming pipeline; see the module docstring.

    ``tracker``: None to embed a tracker service in this process, or
    ``"tcp://host:port"`` of a running ``lowtide serve`` (``secret``: its shared secret),
    or a list of a group's trackers, a leader and its standbys (docs/operating.md).
    ``freeze_gc``: when the embedded tracker starts, ``gc.freeze()`` the objects alive
    in this process, so Python's full collections (which stall the tracker's thread
    with the rest of the process) scan only objects made later; see docs/spark.md.
    ``confirm=False`` is for measuring only: tasks submit their ack batches and end
    without waiting for the tracker's confirmation, which breaks rule 6 (a worker that
    dies right after its task loses the task's acks, and their windows stay stuck).
    ``lowtide bench spark --variants tracked-unconfirmed`` measures what the wait costs.
    ``web_port``: the embedded tracker also serves its web view (0: a free port; the
    link is ``pipe.tracker.web_url``; docs/service.md, "Web view").
    ``progress_metrics``: each query's ``lastProgress["observedMetrics"]["lowtide"]``
    carries the tracker's figures (read on the driver; docs/spark.md, "Monitoring").
    ``front_timeout`` (``"30 seconds"``): a front silent this long is dead; ``dead_fronts``
    ``"wait"`` says so and waits, ``"retire"`` retires it; ``sla``: each sink window of
    ``sla_window`` is late that long after its end (FreshnessListener; docs/operating.md).
    ``hold_wait_s``: how long a window's hold, a sink's acks after a micro-batch, or a
    task's acks, wait for the tracker; then the query stops with one line that says
    what to do (docs/spark.md).
    """

    def __init__(
        self,
        spark: Any,
        name: str = "lowtide",
        *,
        tracker: str | Sequence[str] | None = None,
        secret: str | None = None,
        grid: TimeGrid | None = None,
        state_dir: str | None = None,
        stuck_after_ms: int = 5_000,
        freeze_gc: bool = True,
        confirm: bool = True,
        web_port: int | None = None,
        progress_metrics: bool = True,
        front_timeout: str | int | None = None,
        dead_fronts: str = "wait",
        sla: str | int | None = None,
        sla_window: str | int = "1 second",
        hold_wait_s: float = HOLD_WAIT_S,
    ) -> None:
        self.spark = spark
        self.name = name
        self.grid = grid or TimeGrid()
        self._tracker_options = TrackerOptions(
            url=tracker if tracker is None or isinstance(tracker, str) else ",".join(tracker),
            secret=secret if secret is not None else os.environ.get("LOWTIDE_SECRET"),
            state_dir=state_dir, stuck_after_ms=stuck_after_ms, freeze_gc=freeze_gc,
            confirm=confirm, pipeline=name, web_port=web_port, hold_wait_s=hold_wait_s,
            **operating_options(front_timeout, dead_fronts, sla, sla_window))
        self._progress_metrics = progress_metrics
        self._sources: list[SourceSpec] = []
        self._graph: SegmentGraph | None = None
        self._handle: TrackerHandle | None = None
        self._queries: list[TrackedQuery] = []
        self._rates = RowRates()

    # sources
    def read_log(
        self, path: str, *, fronts: str | list[int] | None = None, name: str = "ingest",
        max_records_per_batch: int | None = None, retire_after_ms: int | None = None,
    ) -> Stream:
        """The ingest log written by :class:`lowtide.Front` producers; one partition
        per front. ``name`` is the ingest segment (the fronts' source segment).
        ``fronts``: the fronts to read (``[0, 1]``, ``"0-3"``; None or ``"auto"``: every
        front the log has); listed ones are also declared (see :meth:`read_stream`)."""
        opts = {"path": os.fspath(path)}
        if fronts is not None:
            opts["fronts"] = fronts if isinstance(fronts, str) else ",".join(map(str, fronts))
        if max_records_per_batch is not None:
            opts["maxRecordsPerBatch"] = str(max_records_per_batch)
        ids = parse_fronts(opts.get("fronts"))
        declared = DeclaredFronts(tuple(ids), retire_after_ms) if ids else None
        return self._set_source(SourceSpec("log", name, opts, fronts=declared))

    def generate(self, spec: GeneratorSpec | None = None, **kwargs: Any) -> Stream:
        """The generator source (see :class:`GeneratorSpec` for ``kwargs``)."""
        spec = spec or GeneratorSpec(**kwargs)
        return self._set_source(SourceSpec("gen", None, {"spec": spec.to_json()}, spec))

    def _set_source(self, src: SourceSpec) -> Stream:
        self._sources.append(src)
        return Stream(self, source=src)

    # tracker
    def describe(self, stream: Stream, sink: str = "sink") -> SegmentGraph:
        return stream.graph(sink)

    def plan(self, *sinks: tuple[Stream, str]) -> SegmentPlan:
        """The segment plan of several sinks, ``(stream, sink name)`` each: start the
        tracker with its graph, then start one query per sink (each query's graph is
        part of it). A sender shared by two sinks is refused (:func:`refuse_fan_out`)."""
        return refuse_fan_out(derive(list(sinks)))

    def start_tracker(self, graph: SegmentGraph) -> TrackerHandle:
        """Start (embedded) or reach (remote) the tracker for ``graph``; idempotent. A
        later query may use a part of the graph the tracker was started with, or add
        its own segments: they are attached to the running tracker (rule 16)."""
        if self._handle is not None:
            if not covers(self._handle.graph, graph):
                self._handle.attach(graph)
                self._graph = self._handle.graph
                declare_fronts(self._sources, self._handle.agent, graph, self.name)
                announce_queries(self._handle.agent, graph)
            return self._handle
        self._graph = graph
        self._handle = TrackerHandle(graph, self.grid, self._tracker_options)
        # before any query runs: the tracker waits for a producer that starts late
        declare_fronts(self._sources, self._handle.agent, graph, self.name)
        announce_queries(self._handle.agent, graph)  # their start-up is not a loss
        return self._handle

    def detach(self, query: TrackedQuery) -> list[str]:
        """Stop ``query`` for good and detach the segments no other query uses from the
        running tracker (rule 16): returns the tracker's report of its items still in
        flight; a log it read no longer keeps records for it."""
        query.stop()
        self._queries = [q for q in self._queries if q is not query]
        keep = {n for q in self._queries for n in q.graph.names}
        gone = [n for n in query.graph.names if n not in keep]
        released = [src for src in self._sources if source_key(src) in gone
                    and (src.kind == "log" or src.options.get("joins_dir"))]
        for src in released:  # first: its fronts leave its segment before it is detached
            if src.kind == "log":
                release_consumer(src.options["path"], source_key(src))
            else:
                release_join(src.options["joins_dir"], source_key(src))
        reports = self.tracker.detach(gone, [source_key(src) for src in released])
        self._graph = self.tracker.graph
        return reports

    @property
    def tracker(self) -> TrackerHandle:
        if self._handle is None:
            raise TrackerNotStarted("the tracker starts with the query (or "
                                    "start_tracker(graph))")
        return self._handle

    @property
    def tracker_ref(self) -> TrackerRef:
        return self.tracker.ref

    def front(self, front: int, log_dir: str | None = None, **kwargs: Any) -> Any:
        """A :class:`lowtide.Front` producer feeding this pipeline's ingest log. A log
        read by several branches (one ``read_log(path, name=...)`` each) is fan-out at
        the front: it sends each record into every branch's ingest segment (rule 11)."""
        from lowtide.spark.sources.front import Front

        logs = [s for s in self._sources if s.kind == "log"]
        if log_dir is not None:
            logs = [s for s in logs if s.options["path"] == os.fspath(log_dir)] or logs
        paths = {s.options["path"] for s in logs}
        if len(paths) != 1:
            raise PipelineShapeError("fronts feed a read_log() source: this pipeline reads "
                             f"{len(paths)} logs (pass the log_dir of one)")
        return Front(log_dir or paths.pop(), front, self.tracker_ref,
                     segment=tuple(source_key(s) for s in logs), **kwargs)

    # running
    def build(self, stream: Stream, sink_name: str = "sink", null_sink: bool = False,
              trace_file: str | None = None, checkpoint: str | None = None,
              changelog_on_driver: bool = False) -> Built:
        """Start the tracker and build the streaming DataFrame of ``stream`` (tracking
        columns included), for a sink that the caller writes and acks itself.
        ``null_sink``: the rows go to Spark's ``noop`` sink and the last step, which
        must be a tracked operator, acks them as received there (``trace_file``: see
        :meth:`Stream.to_null`; a path every executor can append to). ``checkpoint``:
        the query's, for windows planned in Spark's JVM (without it they run on
        ``transformWithState``; see docs/spark.md, "How exact windows work").
        ``changelog_on_driver``: a speculative window, or an exact one (not into the
        null sink), as the last step leaves its driver step to the sink's
        ``foreachBatch`` (``Built.changelog``)."""
        windows = QueryWindows.of(stream, checkpoint, changelog_on_driver, null_sink)
        if null_sink and not (stream.ends_in_operator() or windows.ends_in_window(stream)):
            raise PipelineShapeError("the null sink acks from the last step: a tracked "
                                     "operator")
        plan = refuse_fan_out(stream.plan(sink_name))
        handle = self.start_tracker(plan.graph)
        register_sources(self.spark)
        # each sender sends into one segment (no fan-out above): named after its receiver
        after = {sender: segments[0] for sender, segments in plan.sends_into.items()}
        df = self._plan_stream(stream, Targets(handle.ref, after, sink_name, windows),
                               null_sink, trace_file)
        return Built(df, plan.graph, handle.ref, tuple(windows.holds),
                     windows.changelogs[0] if windows.changelogs else None, update_mode(windows))

    def _plan_stream(self, stream: Stream, to: Targets, null_sink: bool,
                     trace_file: str | None) -> Any:
        """The DataFrame of ``stream``: its source or the union of its inputs, then its
        steps; ``null_sink``: its last step acks the rows as received by the sink."""
        steps: list[Any] = list(stream.steps)
        if stream.source is not None and stream.source.kind == "frame":
            # the entry is a tracked Arrow step: the tracked steps after it share its task
            src = stream.source
            df = src.frame
            steps.insert(0, entry_of(source_key(src), src.options))
        elif stream.source is not None:
            df = read_source(self.spark, stream.source, to)
        elif steps and isinstance(steps[0], JoinSpec):
            left, right = (self._plan_stream(s, to, False, None) for s in stream.inputs)
            spec = steps[0]
            df, keyed = described(lambda: join_input(spec.name, left, right, spec,
                                                     self.grid.delta_ms))
            steps[0] = keyed
        else:
            df = union_by_name([self._plan_stream(s, to, False, None) for s in stream.inputs])
        while steps:
            # tracked Arrow steps that follow each other directly share one task
            n = 1
            if ends_in_arrow_map(steps[0]):
                while n < len(steps) and isinstance(steps[n], OpSpec):
                    n += 1
            group, steps = steps[:n], steps[n:]
            last = null_sink and not steps
            df = plan_steps(df, group, to, last, trace_file if last else None)
        return df

    def _start(self, stream: Stream, sink: tuple[Any, ...], sink_name: str, checkpoint: str,
               trigger: str | None, query_name: str | None) -> TrackedQuery:
        null = sink[0] == "foreach" and sink[1] is None
        acks_last = stream.ends_in_operator() or QueryWindows.of(
            stream, checkpoint, on_driver=True, null_sink=null).ends_in_window(stream)
        null_sink = null and acks_last
        built = self.build(stream, sink_name, null_sink, sink[3] if null_sink else None,
                           checkpoint, changelog_on_driver=True)
        df, graph, ref = built.df, built.graph, built.ref
        if self._progress_metrics:
            df = ProgressMetrics.of(ref, sink_name).observe(df)
        batches = BatchReporter.starting(self.tracker.agent, sink_name, graph.names,
                                         checkpoint)  # a slow start is not a loss
        writer = df.writeStream.option("checkpointLocation", checkpoint)
        if trigger:
            writer = writer.trigger(processingTime=trigger)
        if query_name:
            writer = writer.queryName(query_name)
        tracked: list[TrackedQuery] = []  # a hold's listener or a sink stops the query

        def fail(error: LowtideError) -> None:
            if tracked:  # else the batch raising it stops it (its line: raised_in_task)
                tracked[0].fail(error)

        wait_s = self._tracker_options.hold_wait_s
        fn = None if null_sink else sink_function(sink, ref, sink_name, wait_s, fail)
        sink_close = getattr(fn, "close", None)  # what it leaves when the query stops
        if built.changelog is not None:
            fn = built.changelog.wrap(fn, wait_s=wait_s, on_failure=fail)
        writer = writer.format("noop") if fn is None else writer.foreachBatch(fn)
        # a query takes its session's confs when it starts: JVM windows need theirs then
        confs = WATERMARK_CONFS if built.holds else ()
        if built.update:
            writer, confs = writer.outputMode("update"), SPECULATIVE_CONFS
        with session_confs(self.spark, (*confs, *fixed_plan_confs(self.spark))):
            query = writer.start()
        listeners = [h.listener(str(query.id), wait_s, fail) for h in built.holds]
        for listener in listeners:
            self.spark.streams.addListener(listener)
        closers = [lambda x=x: self.spark.streams.removeListener(x) for x in listeners]
        closers += [h.close for h in built.holds] + ([sink_close] if sink_close else [])
        tq = TrackedQuery(self, query, graph, sink_name, batches, stream=stream,
                          sink_spec=sink, closers=closers)
        tracked.append(tq)
        self._queries.append(tq)
        for listener in listeners:  # after `tracked`: a failed move stops the query
            listener.catch_up(query.lastProgress)  # batches that ended unheard
        return tq

    # recovery (docs/operating.md)
    def replay(self, from_time: Any, to_time: Any, path: str, *, query: TrackedQuery | None = None,
               timeout_s: float = 300.0) -> Replayed:
        """Re-run ``query``'s steps (default: the first query) over the ingest log's
        records of ``[from_time, to_time)`` into a fresh Parquet output at ``path``;
        returns once it is complete below ``to_time`` (:mod:`.replay`)."""
        q = query or self._first_query()
        assert q.stream is not None
        return replay(self, q.stream, from_time, to_time, path, sink=q.sink, timeout_s=timeout_s)

    def losses(self, query: TrackedQuery | None = None) -> list[Loss]:
        """The stuck windows with missing items, each with the log offsets to replay."""
        q = query or self._first_query()
        assert q.stream is not None
        return losses_of(self.tracker.status(), q.stream)

    def repair(self, query: TrackedQuery | None = None, timeout_s: float = 300.0) -> Repaired:
        """Complete the stuck windows of ``query``'s sink by replaying their time range,
        exactly once (:func:`lowtide.spark.pipeline.replay.repair`)."""
        return repair(query or self._first_query(), timeout_s)

    def _first_query(self) -> TrackedQuery:
        if not self._queries:
            raise TrackerNotStarted("this pipeline runs no query: start one, or pass query=")
        return self._queries[0]

    def status(self) -> PipelineStatus:
        """Progress of every query of this pipeline, with the first query still in its
        first micro-batch named (``starting:``)."""
        status = status_of(self.tracker.status(), self.grid, self._rates, graph=self._graph)
        status.starting = next(
            (p for p in (startup_phase(q.query) for q in self._queries) if p), None)
        return status

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop this pipeline's queries and its embedded tracker (also at the end of a
        ``with lowtide.Pipeline(spark, name) as pipe:`` block)."""
        for q in self._queries:
            q.stop()
        self._queries.clear()
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def read_stream(self, df: Any, *, time: str = "lt_time", ack: str = "lt_ack",
                    name: str = "ingest", fronts: list[int] | None = None,
                    retire_after_ms: int | None = None, joins_dir: str | None = None) -> Stream:
        """A streaming DataFrame from any Spark source (Kafka, files, a Delta table)
        whose rows carry a front's labels (``time``: slot, ``ack``: root ack) as a
        tracked stream; ``name`` is its ingest segment, the one its fronts feed. See
        :mod:`lowtide.spark.sources.read_stream`.

        ``fronts``: the ids of every producer that feeds it (one per gateway, per
        Kafka partition, ...). They are declared when the tracker starts: its min
        times wait for each until it registers, so a producer that starts late is
        not refused as behind (its records would be lost); ``retire_after_ms``: stop
        waiting for one that has not registered by then (None: wait until
        ``pipe.tracker.agent.retire_front(id, owner="lowtide-pipeline:<name>")``);
        ``joins_dir``: a directory shared with the producers' fronts (their
        ``joins_dir``): a query attached while they run is joined by each (no restart)
        and reads its records from there on (a column ``lt_front`` names each record's
        front)."""
        check_labelled(df, time, ack, joins=joins_dir is not None)
        declared = None if fronts is None else DeclaredFronts(tuple(fronts), retire_after_ms)
        opts = {"time_col": time, "ack_col": ack,
                **({"joins_dir": joins_dir} if joins_dir else {})}
        return self._set_source(SourceSpec("frame", name, opts, frame=df, fronts=declared))
