"""An embedded tracker runs on a thread of its host's process (a PySpark driver): a
full collection of the host's objects stalls it (35-129 ms measured on a driver with
the pipeline running). Its start freezes the objects alive then, so later full
collections skip them."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.service import TrackerService

GRAPH = SegmentGraph.of(("a", ()), ("sink", ("a",)))


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_an_embedded_tracker_freezes_the_objects_alive_when_it_starts() -> None:
    survivor = [object() for _ in range(100)]  # made before: long-lived
    svc = TrackerService.start(GRAPH)
    try:
        assert gc.get_freeze_count() >= len(survivor)
        assert not any(o is survivor for o in gc.get_objects(generation=2))
    finally:
        svc.stop()


def test_freeze_gc_false_leaves_the_collector_alone() -> None:
    svc = TrackerService.start(GRAPH, freeze_gc=False)
    try:
        assert gc.get_freeze_count() == 0
    finally:
        svc.stop()


def test_a_pipeline_passes_freeze_gc_to_its_embedded_tracker() -> None:
    import lowtide

    pipe = lowtide.Pipeline(None, "gc", freeze_gc=False)
    try:
        pipe.start_tracker(GRAPH)
        assert gc.get_freeze_count() == 0
    finally:
        pipe.close()


def test_only_the_first_embedded_tracker_of_a_process_freezes() -> None:
    """What a tracker started later leaves behind must stay collectable: a second
    embedded tracker (or a user's own gc.freeze() before) leaves the freeze as it is."""
    first = TrackerService.start(GRAPH)
    try:
        frozen = gc.get_freeze_count()
        later = [object() for _ in range(100)]
        second = TrackerService.start(GRAPH)
        second.stop()
        assert gc.get_freeze_count() <= frozen  # frozen objects may still be freed
        assert any(o is later for o in gc.get_objects())  # still collectable
    finally:
        first.stop()
