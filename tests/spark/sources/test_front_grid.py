"""A Front given an agent labels with the tracker's grid, learnt in the handshake
(issue 29, point 5): it assumed the default grid, and nothing compared the two."""

from __future__ import annotations

import pytest

from lowtide import Front
from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service import Agent, TrackerService

pytestmark = pytest.mark.socket

GRAPH = SegmentGraph.of(("src", ()), ("sink", ("src",)))
COARSE = TimeGrid(delta_ms=100, window_slots=2)


def test_a_front_given_an_agent_takes_the_trackers_grid() -> None:
    with TrackerService.start(GRAPH, grid=COARSE) as svc, Agent.connect(svc.url, GRAPH) as agent:
        front = Front(None, 1, agent, segment="src", heartbeat_ms=None)
        try:
            assert front.grid == COARSE
            (registered,) = agent.status()["fronts"].values()
            assert registered[1] == front._now_slot() or registered[1] + 1 == front._now_slot()
        finally:
            front.close()


def test_a_front_whose_grid_is_not_the_trackers_is_refused_where_it_is_made() -> None:
    with (TrackerService.start(GRAPH, grid=COARSE) as svc, Agent.connect(svc.url, GRAPH) as agent,
          pytest.raises(ValueError, match="not the tracker's")):
        Front(None, 1, agent, segment="src", grid=TimeGrid(10, 1), heartbeat_ms=None)
