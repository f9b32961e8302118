"""Fixtures: every server and agent a test starts is stopped in ``finally``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.service import Agent, TrackerService

SECRET = b"correct horse battery staple"


@pytest.fixture
def graph() -> SegmentGraph:
    return SegmentGraph.of(("src", ()), ("mid", ("src",)), ("sink", ("mid",)))


@pytest.fixture
def service(graph: SegmentGraph) -> Iterator[TrackerService]:
    svc = TrackerService.start(graph)
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture
def agent(service: TrackerService, graph: SegmentGraph) -> Iterator[Agent]:
    a = Agent.connect(service.url, graph)
    try:
        yield a
    finally:
        a.close()


@pytest.fixture
def secured(graph: SegmentGraph) -> Iterator[TrackerService]:
    """A server that requires :data:`SECRET`."""
    svc = TrackerService.start(graph, secret=SECRET)
    try:
        yield svc
    finally:
        svc.stop()
