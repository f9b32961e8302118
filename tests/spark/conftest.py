"""Spark test fixtures: ONE SparkSession for the whole run (local[2], small shuffles,
no UI), a real tracker service over loopback per test, and an in-process agent on
top of the core tracker for the pure tests."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from lowtide.core.errors import ProtocolError
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import AckBatch, Heartbeat, RegisterFront
from lowtide.core.time import TimeGrid
from lowtide.core.tracker import Tracker, TrackerConfig

PY = sys.executable


@dataclass(frozen=True)
class Applied:
    """CoreAgent's pending batch: applied at once."""

    applied: bool

    def wait(self) -> bool:
        return self.applied


class CoreAgent:
    """An agent that applies straight to a core Tracker (no network): for pure tests
    of what the Spark layer sends. Keys are deduplicated as the service does."""

    def __init__(self, graph: SegmentGraph, grid: TimeGrid | None = None) -> None:
        self.graph = graph
        self.tracker: Tracker = TrackerConfig(graph, grid or TimeGrid()).build()
        self.keys: set[Any] = set()
        self.batches: list[tuple[Any, AckBatch, tuple[Heartbeat, ...]]] = []
        self.lock = threading.Lock()

    def register_front(self, front: int, segment: str, time: int) -> None:
        with self.lock:
            self.tracker.register_front(RegisterFront(front, segment, time))

    def send_batch(self, key: Any, acks: AckBatch, heartbeats: Iterable[Heartbeat] = (),
                   timeout_s: float = 30.0) -> bool:
        with self.lock:
            if key in self.keys:
                return False
            self.tracker.apply_flush(acks, tuple(heartbeats))
            self.keys.add(key)
            self.batches.append((key, acks, tuple(heartbeats)))
            return True

    def submit_batch(self, key: Any, acks: AckBatch, heartbeats: Iterable[Heartbeat] = (),
                     timeout_s: float = 30.0) -> Applied:
        return Applied(self.send_batch(key, acks, heartbeats, timeout_s))

    def add_acks(self, acks: AckBatch) -> None:
        with self.lock:
            self.tracker.apply(acks)

    def heartbeat(self, front: int, time: int) -> None:
        with self.lock:
            self.tracker.heartbeat(Heartbeat(front, time))

    def step(self) -> dict[str | None, int]:
        with self.lock:
            self.tracker.step(0)
            out: dict[str | None, int] = {n: self.tracker.min_time(n) for n in self.graph.names}
            out[None] = self.tracker.min_time(None)
            return out


@pytest.fixture
def core_agent_factory() -> Iterator[Any]:
    yield CoreAgent


__all__ = ["PY", "CoreAgent", "ProtocolError"]


def pytest_collection_modifyitems(items: list[Any]) -> None:
    """Test modules are not importable on Spark's Python workers: ship the functions
    they define by value."""
    try:
        from pyspark import cloudpickle
    except ImportError:
        return
    package = __name__.rsplit(".", 1)[0]
    for mod in {item.module for item in items if getattr(item, "module", None)}:
        if mod.__name__.startswith(package + "."):
            cloudpickle.register_pickle_by_value(mod)
    helpers = sys.modules.get(package + ".helpers")
    if helpers is not None:
        cloudpickle.register_pickle_by_value(helpers)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = PY
    os.environ["PYSPARK_DRIVER_PYTHON"] = PY
    pyspark_sql = pytest.importorskip("pyspark.sql")
    session = (
        pyspark_sql.SparkSession.builder.master("local[2,4]")
        .appName("lowtide-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.extraJavaOptions", "-Xss32m")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
