"""A running tracked query, and stopping Spark queries between batches."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from lowtide.core.errors import LowtideError
from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.spark.operators.frames import first_line
from lowtide.spark.pipeline.batches import BatchReporter, last_batch_id
from lowtide.spark.pipeline.monitoring import ProgressMetrics
from lowtide.spark.pipeline.status import PipelineStatus
from lowtide.spark.tracking.task_errors import raised_in_task

if TYPE_CHECKING:
    from lowtide.spark.pipeline.builder import Pipeline
    from lowtide.spark.pipeline.stream import Stream

log = logging.getLogger("lowtide.spark.pipeline")


def stop_between_batches(query: Any, graceful_s: float = 10.0) -> None:
    """Stop a streaming query between batches if one ends within ``graceful_s``:
    PySpark's stop during a Python task can kill the stream thread with a
    StackOverflowError (a regex over the interrupted task's long error message), and
    it aborts the batch's writes noisily (Spark's ERROR lines, the Python daemon's
    BrokenPipe traceback). Triggers that run back to back are never idle: the moment
    one reports its progress, the next is still asking its sources for offsets and
    planning, before any task runs, so the query stops then."""
    deadline = time.monotonic() + graceful_s
    done = last_batch_id(query)
    while query.isActive and query.status.get("isTriggerActive", False):
        if time.monotonic() > deadline or last_batch_id(query) != done:
            break
        time.sleep(0.002)
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


def await_idle(timeout_s: float = 10.0) -> bool:
    """Return once the session runs no stage (True), or after ``timeout_s`` (False):
    a session stopped under a running task prints Spark's ERROR lines (a task's
    completion listener finds its broadcast block gone: one bench run in five)."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    deadline = time.monotonic() + timeout_s
    while sc is not None and list(sc.statusTracker().getActiveStageIds()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _stages(tracker: Any, job_group: str) -> list[Any]:
    """The stages Spark knows of the jobs of ``job_group`` (a query run's id)."""
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(job_group)]
    stages = [tracker.getStageInfo(s) for j in jobs if j is not None for s in j.stageIds]
    return [st for st in stages if st is not None]


def _active_tasks(tracker: Any, job_group: str) -> int:
    return sum(st.numActiveTasks for st in _stages(tracker, job_group))


def startup_phase(query: Any) -> str | None:
    """What a streaming query's first micro-batch is doing, for a user who would see
    nothing for tens of seconds otherwise (Python workers and state stores start):
    ``"batch 0 planning (Getting offsets from ...)"`` or ``"batch 0 running: 3/6
    tasks done"``. None once a batch has finished (or the query stopped)."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None or not query.isActive or last_batch_id(query) >= 0:
        return None
    stages = _stages(sc.statusTracker(), str(query.runId))
    if not stages:
        return f"batch 0 planning ({query.status.get('message', '')})"
    done = sum(st.numCompletedTasks for st in stages)
    return f"batch 0 running: {done}/{sum(st.numTasks for st in stages)} tasks done"


def spark_activity(query: Any, now_s: float | None = None) -> str:
    """What Spark's query is doing, for a wait that ran out: its status message and
    the last micro-batch it ran (an idle query's progress reports, every 10 s, name
    the next batch and run none), so a query that stopped running batches tells itself
    apart from one whose batches run and whose input is missing.

    >>> ran = {"batchId": 41, "timestamp": "2026-11-29T06:00:00.000Z",
    ...        "durationMs": {"addBatch": 30, "triggerExecution": 50}}
    >>> idle = {"batchId": 42, "timestamp": "2026-11-29T06:00:10.000Z",
    ...         "durationMs": {"latestOffset": 1, "triggerExecution": 1}}
    >>> q = type("Q", (), {"status": {"message": "Waiting for next trigger"},
    ...                    "recentProgress": [ran, idle]})
    >>> spark_activity(q, now_s=datetime(2026, 11, 29, 6, 0, 12, tzinfo=UTC).timestamp())
    'Waiting for next trigger; micro-batch 41 the last run, started 12.0 s ago'
    """
    message = query.status.get("message", "")
    last = next((p for p in reversed(query.recentProgress)
                 if "addBatch" in p.get("durationMs", {})), None)
    if last is None:
        return f"{message}; no micro-batch run"
    started = datetime.fromisoformat(last["timestamp"]).timestamp()
    ago_s = (time.time() if now_s is None else now_s) - started
    return f"{message}; micro-batch {last['batchId']} the last run, started {ago_s:.1f} s ago"


class TrackedQuery:
    """A running tracked query: what Spark's ``StreamingQuery`` answers (``id``,
    ``runId``, ``name``, ``status``, ``lastProgress``, ``recentProgress``,
    ``awaitTermination``, ``exception``, ``stop``, ``isActive``, ``explain``) plus the
    tracker's view, in timestamps: :meth:`complete_below` (every row before it is
    committed at the sink), :meth:`wait_until_complete`, :meth:`stuck`,
    :meth:`progress`. While it runs, its figures are published for its observed metrics
    (:mod:`lowtide.spark.pipeline.monitoring`)."""

    def __init__(self, pipeline: Pipeline, query: Any, graph: SegmentGraph,
                 sink: str | None = None, batches: BatchReporter | None = None, *,
                 stream: Stream | None = None,
                 sink_spec: tuple[Any, ...] | None = None,
                 closers: list[Callable[[], None]] | None = None) -> None:
        self.pipeline = pipeline
        self._closers = closers or []  # what goes with the query (its listeners)
        # what the query runs, as described: a replay runs it again
        self.stream, self.sink_spec = stream, sink_spec
        self.query = query
        self._failure: LowtideError | None = None  # lowtide stopped it (see fail)
        self.graph = graph
        self.sink = sink or graph.names[-1]
        self.metrics = ProgressMetrics.of(pipeline.tracker.ref, self.sink)
        self._publisher = self.metrics.build(pipeline).start()
        # the tracker tells this query's slow batches from losses (issue 34)
        batches = batches or BatchReporter(pipeline.tracker.agent, self.sink, graph.names)
        self._batches = batches.watching(query)

    # what StreamingQuery answers
    @property
    def id(self) -> str:
        return str(self.query.id)

    @property
    def runId(self) -> str:
        return str(self.query.runId)

    @property
    def name(self) -> str | None:
        return self.query.name  # type: ignore[no-any-return]

    @property
    def isActive(self) -> bool:
        return bool(self.query.isActive)

    @property
    def status(self) -> dict[str, Any]:
        """Spark's status (``message``, ``isDataAvailable``, ``isTriggerActive``) with
        ``completeBelow`` (ISO timestamp, the sink's) and, until the first batch is
        done, ``starting``."""
        out = dict(self.query.status)
        with contextlib.suppress(LowtideError):  # the pipeline (its tracker) is closed
            out["completeBelow"] = self.complete_below().isoformat()
        starting = startup_phase(self.query)
        if starting:
            out["starting"] = starting
        return out

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        return self.query.lastProgress  # type: ignore[no-any-return]

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        return list(self.query.recentProgress)

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        """Spark's: block until the query ends (``timeout`` s: False if it did not);
        raises the error lowtide stopped it with (:meth:`fail`, or raised in a task)."""
        try:
            ended = self.query.awaitTermination(timeout)
        except Exception as exc:  # Spark's wrapping of the error a sink or task raised
            failure = self._failure or raised_in_task(exc)
            if failure is None:
                raise
            raise failure from None
        if self._failure is not None and not self.query.isActive:
            raise self._failure from None
        return ended  # type: ignore[no-any-return]

    def exception(self) -> Any:
        """Why the query ended: the error lowtide stopped it with (one line, also one
        a task raised), else Spark's."""
        error = self.query.exception()
        return self._failure or raised_in_task(error) or error

    def fail(self, error: LowtideError) -> threading.Thread:
        """Stop the query because of ``error`` (one line that says what to do), from a
        thread of its own (a listener calls this, and must not wait for the stop);
        :meth:`exception` and :meth:`awaitTermination` report it. Returns the thread."""
        self._failure = self._failure or error
        thread = threading.Thread(target=lambda: self.stop(graceful_s=0), daemon=True,
                                  name=f"lowtide-fail-{self.id}")
        thread.start()
        return thread

    def explain(self, extended: bool = False) -> None:
        self.query.explain(extended)

    def processAllAvailable(self) -> None:
        self.query.processAllAvailable()

    # lowtide's own
    def progress(self) -> PipelineStatus:
        """The pipeline's progress, with this query's start-up phase until its first
        batch is done."""
        status = self.pipeline.status()
        status.starting = startup_phase(self.query)
        return status

    def complete_below(self, segment: str | None = None) -> datetime:
        """Every row with a time before this (UTC) is committed at ``segment`` (default:
        the sink): its min time, as a timestamp."""
        return timestamp_of(self.min_time(segment or self.sink), self.pipeline.grid)

    def wait_until_complete(self, until: datetime | int, segment: str | None = None,
                            timeout_s: float = 60.0) -> datetime:
        """Block until every row before ``until`` (a datetime, or ms since the epoch)
        is committed at ``segment`` (default: the sink); returns :meth:`complete_below`."""
        slot = self.wait_for_min_time(slot_after(until, self.pipeline.grid), segment,
                                      timeout_s)
        return timestamp_of(slot, self.pipeline.grid)

    def min_time(self, segment: str | None = None) -> int:
        """The min time of ``segment`` (None: the global one; ``"<segment>#<r>"``: one
        of its key ranges), as a slot."""
        doc = self.pipeline.tracker.status()
        if segment is None:
            return int(doc["global_min"])
        s, r = self.graph.resolve(segment)
        seg = next(d for d in doc["segments"] if d["segment"] == self.graph.names[s])
        return int(seg["min_time"] if r is None else seg["key_ranges"][r])

    def stuck(self) -> list[str]:
        """Each stuck window: its segment, its time range (UTC) and what is missing or
        extra."""
        grid = self.pipeline.grid
        return [f"segment {w['segment']!r}, {span(w['window_start'], w['window_end'], grid)}:"
                f" {what_of(w)}" for w in self.pipeline.tracker.status().get("stuck_detail", [])]

    def wait_for_min_time(self, time_slot: int, segment: str | None = None,
                          timeout_s: float = 60.0) -> int:
        """Block until ``segment`` (default: the sink) passes slot ``time_slot``
        (:meth:`wait_until_complete` takes a timestamp)."""
        seg = segment or self.sink
        deadline = time.monotonic() + timeout_s
        while True:
            t = self.min_time(seg)
            if t >= time_slot:
                return t
            if self.exception() is not None:
                raise QueryFailed(f"query failed: {first_line(self.exception())}")
            if time.monotonic() > deadline:
                grid = self.pipeline.grid
                raise TimeoutError(f"{seg!r} complete below {timestamp_of(t, grid)}, waited "
                                   f"for {timestamp_of(time_slot, grid)}; stuck: "
                                   f"{self.stuck()}; Spark: {spark_activity(self.query)}")
            time.sleep(0.05)

    def stop(self, *, graceful_s: float = 10.0) -> None:
        stop_between_batches(self.query, graceful_s)
        self._publisher.stop()
        self._batches.stop()
        for close in self._closers:
            close()
        self._closers = []

    def stop_when_complete(self) -> threading.Thread:
        """A backfill (``trigger(availableNow=True)``): stop the query once the sink is
        complete up to what the fronts had promised when its first batch ended (the
        sources' fronts are registered then), so every window ending by then was
        emitted; for finished fronts, every window. Returns the thread that waits."""
        thread = threading.Thread(target=self._stop_at_input_bound, daemon=True,
                                  name=f"lowtide-backfill-{self.id}")
        thread.start()
        return thread

    def _stop_at_input_bound(self) -> None:
        try:
            while self.query.isActive and last_batch_id(self.query) < 0:
                time.sleep(0.05)
            target = input_bound(self.pipeline.tracker.status(), self.graph)
            while self.query.isActive:
                if self.min_time(self.sink) >= target:
                    log.info("backfill complete", extra={"query": self.id, "slot": target})
                    self.stop()
                    return
                time.sleep(0.05)
        except (LowtideError, OSError) as err:  # the pipeline closed under it
            log.info("backfill watch ended", extra={"query": self.id, "why": str(err)})


class QueryFailed(LowtideError, RuntimeError):
    """The tracked query failed (Spark's error, first line)."""


def input_bound(doc: dict[str, Any], graph: SegmentGraph) -> int:
    """The fronts' promise over the graph's source segments: the smallest bound of a
    segment with no inbound segment."""
    sources = {graph.names[i] for i in range(len(graph.names)) if not graph.inbound[i]}
    return min(int(s["bound"]) for s in doc["segments"] if s["segment"] in sources)


def timestamp_of(slot: int, grid: TimeGrid) -> datetime:
    """The start of ``slot`` as a UTC timestamp."""
    return datetime.fromtimestamp(grid.slot_start_ms(slot) / 1000, tz=UTC)


def slot_after(until: datetime | int, grid: TimeGrid) -> int:
    """The first slot whose rows are all at or after ``until`` (datetime or epoch ms):
    a min time there means every row before ``until`` is complete."""
    ms = until if isinstance(until, int) else round(until.timestamp() * 1000)
    return -(-ms // grid.delta_ms)


def span(start: int, end: int, grid: TimeGrid) -> str:
    return f"{timestamp_of(start, grid).isoformat()} to {timestamp_of(end, grid).isoformat()}"


def what_of(window: dict[str, Any]) -> str:
    parts = [f"{window['missing']} item(s) missing"] if window.get("missing") else []
    parts += [f"{window['extra']} extra item(s) (duplicates)"] if window.get("extra") else []
    return ", ".join(parts) or "open"
