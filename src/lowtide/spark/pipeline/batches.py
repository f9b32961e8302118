"""A query's micro-batches, told to the tracker: which batch runs, which closed.

The tracker tells a slow batch from a loss only if it knows what is running (see
``lowtide.core.open_batches``). Spark's listener has no "batch started" event, so a
driver thread watches the query: ``status["isTriggerActive"]`` with
``isDataAvailable`` says a batch runs, ``lastProgress["batchId"]`` which one closed
last (the running one is the next). It reports a batch when it opens, says so again
every ``keepalive_s`` while it runs (a driver that died is forgotten by the tracker),
reports the last closed batch whenever it moves (also for batches too short to be
seen running), and says when the query stopped. The poll reads the batch id from the
JVM, not ``lastProgress`` (see :func:`last_batch_id`). A report that fails (the tracker
restarting) is dropped: the next poll says it again.

The first batch is announced before the query starts: a query's start (sources
initialised, the first batch planned, Python workers started) takes seconds, and the
records the fronts write meanwhile are that batch's to read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from lowtide.core.graph import SegmentGraph
from lowtide.core.open_batches import STARTING
from lowtide.service.freshness import ancestors, sinks
from lowtide.wire.messages import BatchState

log = logging.getLogger("lowtide.spark.batches")

#: report(batch, state): one message to the tracker
Report = Callable[[int, BatchState], None]
#: what a query that is still being started looks like to a poll
STARTING_STATUS = {"isTriggerActive": False, "isDataAvailable": False}


def announce_queries(agent: Any, graph: SegmentGraph) -> None:
    """A pipeline's tracker started: each of its sinks will have a query, whose start
    takes seconds; until each says more (:class:`BatchReporter`, named after its sink),
    what the fronts write meanwhile is waiting for it to start, not missing."""
    for sink in sinks(graph):
        with contextlib.suppress(Exception):  # an agent without reports (tests): no harm
            agent.report_batch(sink, STARTING, BatchState.OPEN,
                               sorted(ancestors(graph, sink)), timeout_s=5.0)


def last_batch_id(query: Any) -> int:
    """The id of a query's last finished batch (-1: none yet), read from the JVM:
    ``lastProgress`` turns the whole progress report (every operator's and source's
    figures, the observed metrics) into Python objects, which a poll every 0.25 s
    paid for in the driver's CPU (one a second now)."""
    jsq = getattr(query, "_jsq", None)  # classic PySpark; Spark Connect has the dict only
    if jsq is None:
        last = query.lastProgress
        return -1 if last is None else int(last["batchId"])
    progress = jsq.lastProgress()
    return -1 if progress is None else int(progress.batchId())


def first_batch(checkpoint: str | None) -> int:
    """The id the query's first batch of this run gets: one past the last planned in
    its (local) checkpoint, 0 for a new one or one we cannot list."""
    offsets = os.path.join(checkpoint, "offsets") if checkpoint else None
    try:
        ids = [int(n) for n in os.listdir(offsets) if n.isdigit()] if offsets else []
    except OSError:
        ids = []
    return max(ids, default=-1) + 1


class BatchWatch:
    """What one poll of a query saw, turned into reports (no thread, no Spark: the
    :class:`BatchReporter` feeds it ``status`` and ``lastProgress``)."""

    def __init__(self, report: Report, first: int = 0, keepalive_s: float = 1.0) -> None:
        self.report, self.first, self.keepalive_s = report, first, keepalive_s
        self.open: int | None = None
        self.closed: int | None = None
        self._said_s = 0.0
        self._ran = False  # the open batch was seen running (not just announced)

    def starting(self, now_s: float) -> None:
        """The query is about to start: its first batch is as good as open."""
        self.open, self._said_s = self.first, now_s
        self.report(self.first, BatchState.OPEN)

    def poll(self, status: dict[str, Any], last: int | None, now_s: float) -> None:
        if last is not None and last != self.closed:
            if self.open is not None and self.open <= last:
                self.open = None
            self.closed = last
            self.report(last, BatchState.CLOSED)
        running = self.first if last is None else last + 1
        idle = self._ran and not status["isTriggerActive"]
        if self.open is not None and (self.open != running or idle):
            self.report(self.open, BatchState.CLOSED)
            self.open = None
        active = status["isTriggerActive"] and status["isDataAvailable"]
        self._ran = active and self.open in (None, running)
        if self.open is None and active:
            self.open, self._said_s = running, now_s
            self.report(running, BatchState.OPEN)
        elif self.open is not None and now_s - self._said_s >= self.keepalive_s:
            self._said_s = now_s
            self.report(self.open, BatchState.OPEN)


class BatchReporter:
    """A daemon thread per tracked query: polls it every ``interval_s`` and reports its
    batches to the tracker (``agent.report_batch``) under ``name``, acking into
    ``segments``. Made before the query starts (:meth:`starting`), then
    :meth:`watching` it. A second is fine enough: windows are reported stuck after
    seconds (``stuck_after_ms``) and open batches forgotten after 30; a poll every
    0.25 s (four Py4J calls and about one report each) cost a quarter of a point of
    the window bench's CPU ratio."""

    def __init__(self, agent: Any, name: str, segments: tuple[str, ...],
                 checkpoint: str | None = None, interval_s: float = 1.0) -> None:
        self.query: Any = None
        self.agent, self.name, self.segments = agent, name, segments
        self.interval_s = interval_s
        self.watch = BatchWatch(self._send, first_batch(checkpoint))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lowtide-batches-{name}",
                                        daemon=True)

    @classmethod
    def starting(cls, agent: Any, name: str, segments: tuple[str, ...],
                 checkpoint: str | None = None) -> BatchReporter:
        """Announce the query's first batch (kept alive until :meth:`watching`)."""
        reporter = cls(agent, name, segments, checkpoint)
        reporter.watch.starting(time.monotonic())
        reporter._thread.start()
        return reporter

    def watching(self, query: Any) -> BatchReporter:
        self.query = query
        if not self._thread.is_alive():
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _send(self, batch: int, state: BatchState) -> None:
        try:
            self.agent.report_batch(self.name, batch, state, self.segments, timeout_s=5.0)
        except Exception as exc:  # the tracker restarting or closed: said again next poll
            log.debug("batch report dropped", extra={"query": self.name, "reason": repr(exc)})

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.query is None:  # still starting
                self.watch.poll(STARTING_STATUS, None, time.monotonic())
                continue
            try:
                if not self.query.isActive:
                    break
                last = last_batch_id(self.query)
                self.watch.poll(self.query.status, None if last < 0 else last,
                                time.monotonic())
            except Exception as exc:  # the JVM going away with the query: stop quietly
                log.debug("batch watch stopped", extra={"query": self.name,
                                                        "reason": repr(exc)})
                break
        self._send(-1, BatchState.STOPPED)
