"""The embedded tracker runs on a thread of the driver's process: a full collection
of the driver's objects stalls it (20-60 ms measured on a PySpark driver). Its start
freezes the objects alive then, so later full collections skip them."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

import lowtide
from lowtide.core.graph import SegmentGraph

GRAPH = SegmentGraph.of(("a", ()), ("sink", ("a",)))


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_embedded_tracker_freezes_the_objects_alive_when_it_starts() -> None:
    pipe = lowtide.Pipeline(None, "gc")
    try:
        survivor = [object() for _ in range(100)]  # made before: long-lived
        pipe.start_tracker(GRAPH)
        assert gc.get_freeze_count() >= len(survivor)
        assert not any(o is survivor for o in gc.get_objects(generation=2))
    finally:
        pipe.close()


def test_freeze_gc_false_leaves_the_collector_alone() -> None:
    pipe = lowtide.Pipeline(None, "gc", freeze_gc=False)
    try:
        pipe.start_tracker(GRAPH)
        assert gc.get_freeze_count() == 0
    finally:
        pipe.close()


def test_only_the_first_embedded_tracker_of_a_process_freezes() -> None:
    """Objects of a pipeline that is closed later must stay collectable: a second
    embedded tracker (or a user's own gc.freeze() before) leaves the freeze as it is."""
    first = lowtide.Pipeline(None, "gc-1")
    second = lowtide.Pipeline(None, "gc-2")
    try:
        first.start_tracker(GRAPH)
        frozen = gc.get_freeze_count()
        later = [object() for _ in range(100)]
        second.start_tracker(GRAPH)
        assert gc.get_freeze_count() <= frozen  # frozen objects may still be freed
        assert any(o is later for o in gc.get_objects())  # still collectable
    finally:
        second.close()
        first.close()
