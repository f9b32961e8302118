"""A Pipeline's embedded tracker carries the pipeline's name as its metrics'
``pipeline`` label (issue 23 point 4, for Spark pipelines) and serves the web view on
request (point 2); tests/service/test_metric_names.py checks that the label reaches
every exported series, tests/service/test_web_http.py the view itself."""

from __future__ import annotations

import urllib.request

from lowtide.core.graph import SegmentGraph
from lowtide.spark.pipeline import Pipeline

GRAPH = SegmentGraph.of(("parse", ()), ("sink", ("parse",)))


def test_embedded_tracker_is_labelled_with_the_pipeline_and_serves_its_view() -> None:
    pipe = Pipeline(None, "orders", web_port=0)
    handle = pipe.start_tracker(GRAPH)
    try:
        assert handle.service.server.config.pipeline == "orders"
        assert handle.web_url is not None and handle.web_url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(handle.web_url + "api/view", timeout=10) as answer:
            assert b"parse" in answer.read()
    finally:
        pipe.close()


def test_the_view_is_off_unless_asked_for() -> None:
    pipe = Pipeline(None, "orders")
    try:
        assert pipe.start_tracker(GRAPH).web_url is None
    finally:
        pipe.close()
