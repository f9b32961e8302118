"""How the tracker's figures reach a query's observed metrics
(:class:`~lowtide.spark.pipeline.monitoring.ProgressMetrics`): a driver thread copies
them into a map in the driver's JVM (:class:`ProgressPublisher`), and each metric reads
its figure from that map where Spark computes the metrics: on the driver
(:func:`figure_columns`).

Spark evaluates an observation's aggregates in the tasks, row by row, but the
expressions over them (and a metric without any aggregate is one) on the driver only,
each time it reads the metrics' value: as each task ends (for its UI) and at the
batch's end (for the progress). lowtide's metrics hold no aggregate: the rows pay
nothing for them (before: 14 aggregates a row, and on a cluster an Arrow UDF that took
every row into Python), and the figures are the driver's in local mode and on a
cluster alike.

Spark's analyzer allows only deterministic expressions outside an aggregate, so the
figures are read by a deterministic UDF whose function is the map itself (a Scala view
of a ``java.util.concurrent.ConcurrentHashMap``: a ``Function1`` from a key to its
text): a lookup in the JVM, no call into Python. Spark builds such an untyped UDF only
under ``spark.sql.legacy.allowUntypedScalaUDF``, set while it is made (its input is a
string literal and its output a string: nothing to type). The map holds one entry, all
the figures as one JSON array (:data:`FIGURES_KEY`), and each metric takes its element
(``get_json_object``): a publication that changed anything is one Py4J call, where it
was one per changed figure, six to eight (each about 75 us of the driver's CPU, Python
and JVM: BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from lowtide.spark.operators.window_plan import session_confs
from lowtide.spark.pipeline.status import status_of

if TYPE_CHECKING:
    from lowtide.spark.pipeline.monitoring import ProgressMetrics

#: per JVM, tracker url and sink: the driver JVM's map of the figures
_maps: dict[tuple[int, str, str], Any] = {}
_maps_lock = threading.Lock()
UNTYPED_UDF = "spark.sql.legacy.allowUntypedScalaUDF"
#: the map's one key: every figure, a JSON array in ``ProgressMetrics.figures()`` order
FIGURES_KEY = "figures"


def figures_map(metrics: ProgressMetrics, spark: Any) -> Any:
    """The driver JVM's map (a ``ConcurrentHashMap``) of ``metrics``' figures."""
    jvm = spark.sparkContext._jvm
    key = (id(jvm), metrics.tracker.url, metrics.sink)
    with _maps_lock:
        if key not in _maps:
            _maps[key] = jvm.java.util.concurrent.ConcurrentHashMap()
        return _maps[key]


def figures_text(figures: Iterable[str], values: dict[str, Any]) -> str:
    """What :func:`figures_map` holds under :data:`FIGURES_KEY`: ``values`` in the order
    of ``figures`` (a figure without a value: null).

    >>> figures_text(["a", "b", "late"], {"a": 7, "late": "{}"})
    '[7, null, "{}"]'
    """
    return json.dumps([values.get(f) for f in figures])


def figure_columns(metrics: ProgressMetrics, spark: Any, figures: Iterable[str]) -> list[Any]:
    """A string column per figure: its element of the latest text, read from
    :func:`figures_map` where it is evaluated (outside an aggregate: on the driver);
    a figure without a value (JSON null) reads ``"null"``, which a cast to a number
    turns into null. One UDF serves them all: each is some 30 Py4J calls to make,
    which a query's start waits for."""
    from pyspark.sql import functions as F
    from pyspark.sql.classic.column import Column, _to_seq

    jvm = spark.sparkContext._jvm
    lookup = jvm.scala.jdk.javaapi.CollectionConverters.asScala(
        figures_map(metrics, spark)).withDefaultValue(None)
    with session_confs(spark, ((UNTYPED_UDF, "true"),)):
        udf = jvm.org.apache.spark.sql.functions.udf(
            lookup, jvm.org.apache.spark.sql.types.DataTypes.StringType)
    text = Column(udf.apply(_to_seq(spark.sparkContext, [F.lit(FIGURES_KEY)._jc])))
    return [F.get_json_object(text, f"$[{i}]") for i, _ in enumerate(figures)]


class ProgressPublisher:
    """A driver thread that copies a pipeline's figures into :func:`figures_map`
    every ``interval_s``."""

    def __init__(self, metrics: ProgressMetrics, pipeline: Any) -> None:
        self.metrics = metrics
        self._pipeline = pipeline
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._published: str | None = None

    def publish(self) -> None:
        """Copy the tracker's current figures once, if any changed: one Py4J call (30 us
        of the driver's Python CPU and 44 of its JVM's, measured)."""
        handle = self._pipeline.tracker
        status = status_of(handle.status(), handle.grid, graph=handle.graph)
        text = figures_text(self.metrics.figures(), self.metrics.values(status))
        if text != self._published:
            figures_map(self.metrics, self._pipeline.spark).put(FIGURES_KEY, text)
            self._published = text

    def start(self) -> ProgressPublisher:
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
