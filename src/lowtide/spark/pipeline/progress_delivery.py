"""How the tracker's figures reach the tasks that compute a query's observed metrics
(:class:`~lowtide.spark.pipeline.monitoring.ProgressMetrics`): in local mode a driver
thread publishes them as the JVM's system properties (:class:`ProgressPublisher`); on
a cluster, whose executors are other JVMs, the tasks ask the tracker themselves
(:func:`figures_udf`)."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lowtide.service.clock import wall_ms
from lowtide.spark.pipeline.status import status_of
from lowtide.spark.tracking.column import TRACK_COL
from lowtide.spark.tracking.transport import connect

if TYPE_CHECKING:
    from lowtide.spark.pipeline.monitoring import ProgressMetrics

log = logging.getLogger("lowtide.spark.monitoring")

#: the column the figures pass in between the UDF and the observation (dropped after)
PROGRESS_COL = "lt_progress"
#: at most one status request per Python worker and sink this often
TASK_INTERVAL_S = 1.0


def tasks_share_driver_jvm(spark: Any) -> bool:
    """Whether the session's tasks run in the driver's JVM (``local`` or ``local[N]``;
    ``local-cluster`` starts executors of their own)."""
    master = str(spark.sparkContext.master)
    return master == "local" or master.startswith("local[")


class ProgressPublisher:
    """A driver thread that copies a pipeline's figures into the JVM's system
    properties, where the tasks of local mode read them (on a cluster it does
    nothing: the tasks ask the tracker)."""

    def __init__(self, metrics: ProgressMetrics, pipeline: Any) -> None:
        self.metrics = metrics
        self._pipeline = pipeline
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._published: dict[str, Any] = {}

    def publish(self) -> None:
        """Copy the tracker's current figures once: those that changed (each is a
        Py4J call: 40-60 us of the driver's Python CPU, measured)."""
        handle = self._pipeline.tracker
        status = status_of(handle.status(), handle.grid, graph=handle.graph)
        system = self._pipeline.spark.sparkContext._jvm.java.lang.System
        figures = self.metrics.values(status)
        if self._published.get("late") != figures["late"]:
            figures["fetched_ms"] = wall_ms()  # orders the late texts: the newest wins
        for figure, value in figures.items():
            if self._published.get(figure) != value:
                system.setProperty(self.metrics.property_of(figure), str(value))
                self._published[figure] = value

    def start(self) -> ProgressPublisher:
        asks = self.metrics.tasks_ask
        if asks or (asks is None and not tasks_share_driver_jvm(self._pipeline.spark)):
            return self
        self._thread = threading.Thread(target=self._run, name="lowtide-progress", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            # a tracker or JVM going away means the query stops next: keep quiet till then
            with contextlib.suppress(Exception):
                self.publish()
            self._stop.wait(self.metrics.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None


def figures_udf(metrics: ProgressMetrics, df: Any) -> Any:
    """The column of the figures (a struct, :meth:`ProgressMetrics.schema`) that the
    tasks fetch from the tracker: set on the first row of each Arrow batch, null on
    the others."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.functions import arrow_udf

    def figures(rows: pa.Array) -> pa.Array:
        return figures_column(metrics, len(rows))

    udf = arrow_udf(figures, "string").asNondeterministic()
    anchor = F.col(TRACK_COL) if TRACK_COL in df.columns else F.lit(0)
    return F.from_json(udf(anchor), metrics.schema())


def fetch(metrics: ProgressMetrics) -> str | None:
    """The figures now, as the JSON text the observation parses (None: the tracker
    did not answer within ``timeout_s``)."""
    ref = metrics.tracker
    try:
        doc = connect(ref).status(timeout_s=metrics.timeout_s)  # type: ignore[attr-defined]
    except Exception as exc:  # the batch goes on, with null figures
        log.debug("no progress figures", extra={"url": ref.url, "error": repr(exc)})
        return None
    status = status_of(doc, ref.grid, graph=ref.graph)
    return json.dumps({**metrics.values(status), "fetched_ms": wall_ms()})


#: per Python worker: (url, sink) -> (monotonic time fetched, figures)
_fetched: dict[tuple[str, str], tuple[float, str | None]] = {}
_fetch_lock = threading.Lock()


def figures_column(metrics: ProgressMetrics, rows: int) -> pa.Array:
    """The UDF's answer for an Arrow batch of ``rows``: the figures (fetched at most
    once per :data:`TASK_INTERVAL_S` in this process) on its first row, nulls after."""
    key = (metrics.tracker.url, metrics.sink)
    with _fetch_lock:
        at, text = _fetched.get(key, (float("-inf"), None))
        if time.monotonic() - at >= TASK_INTERVAL_S:
            text = fetch(metrics)
            _fetched[key] = (time.monotonic(), text)
    if rows == 0:
        return pa.nulls(0, pa.string())
    return pa.concat_arrays([pa.array([text], pa.string()), pa.nulls(rows - 1, pa.string())])
