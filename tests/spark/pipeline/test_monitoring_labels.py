"""The embedded tracker's metrics carry the pipeline's name as their ``pipeline``
label (issue 23 point 4, for Spark pipelines); tests/service/test_metric_names.py
checks that the label reaches every exported series."""

from __future__ import annotations

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.spark.pipeline import TrackerHandle

GRAPH = SegmentGraph.of(("parse", ()), ("sink", ("parse",)))


def test_embedded_tracker_labels_its_metrics_with_the_pipeline() -> None:
    handle = TrackerHandle(GRAPH, TimeGrid(), None, None, None, 5_000, pipeline="orders")
    try:
        server = handle.service.server
        assert server.config.pipeline == "orders"
    finally:
        handle.close()

