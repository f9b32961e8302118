"""A running tracked query, and stopping Spark queries between batches."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lowtide.core.graph import SegmentGraph
from lowtide.spark.pipeline.monitoring import ProgressMetrics
from lowtide.spark.pipeline.status import PipelineStatus

if TYPE_CHECKING:
    from lowtide.spark.pipeline.builder import Pipeline

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
    done = _last_batch(query)
    while query.isActive and query.status.get("isTriggerActive", False):
        if time.monotonic() > deadline or _last_batch(query) != done:
            break
        time.sleep(0.002)
    query.stop()
    await_jobs_gone(str(query.runId))


def _last_batch(query: Any) -> int:
    """The id of the query's last finished batch (-1: none yet), without turning the
    whole progress report into Python objects."""
    jsq = getattr(query, "_jsq", None)  # classic PySpark; Spark Connect has the dict only
    if jsq is None:
        last = query.lastProgress
        return -1 if last is None else int(last["batchId"])
    progress = jsq.lastProgress()
    return -1 if progress is None else int(progress.batchId())


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
    if sc is None or not query.isActive or _last_batch(query) >= 0:
        return None
    stages = _stages(sc.statusTracker(), str(query.runId))
    if not stages:
        return f"batch 0 planning ({query.status.get('message', '')})"
    done = sum(st.numCompletedTasks for st in stages)
    return f"batch 0 running: {done}/{sum(st.numTasks for st in stages)} tasks done"


class TrackedQuery:
    """A running tracked query: Spark's ``StreamingQuery`` plus the tracker's view.
    While it runs, its figures are published for its observed metrics
    (:mod:`lowtide.spark.pipeline.monitoring`)."""

    def __init__(self, pipeline: Pipeline, query: Any, graph: SegmentGraph,
                 sink: str | None = None, closers: list[Callable[[], None]] | None = None
                 ) -> None:
        self.pipeline = pipeline
        self._closers = closers or []  # what goes with the query (its listeners)
        self.query = query
        self.graph = graph
        self.sink = sink or graph.names[-1]
        self.metrics = ProgressMetrics.of(pipeline.name, graph, self.sink)
        self._publisher = self.metrics.build(pipeline).start()

    @property
    def id(self) -> str:
        return str(self.query.id)

    def status(self) -> PipelineStatus:
        """The pipeline's progress, with this query's start-up phase until its first
        batch is done."""
        status = self.pipeline.status()
        status.starting = startup_phase(self.query)
        return status

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
        self._publisher.stop()
        for close in self._closers:
            close()
        self._closers = []
