"""The examples under ``examples/`` run (each checks its own output against a batch
recomputation; one that reads Kafka gets the test session's broker and a new topic
with two partitions). tests/test_docs.py checks that the docs blocks naming an example
are verbatim parts of it."""

from __future__ import annotations

import importlib.util
import inspect
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
#: examples over a minute on 2 cores, and the tests of ``make test`` that show the same
#: (at load 17: medallion 391 s, two_writers 97 s; replay_repair 45 s, 90 s at load 28)
SLOW = {"medallion": "tests/spark/sinks/test_tables.py (the Parquet chain), test_cuts_e2e.py",
        "two_writers": "tests/spark/sinks/test_two_writers.py",
        "replay_repair": "tests/spark/pipeline/test_replay_e2e.py",
        "kafka_to_table": "tests/spark/sources (Kafka), tests/spark/sinks/test_tables.py",
        "retry_loop": "tests/spark/operators/test_retry_e2e.py",
        "sliding_max": "tests/spark/operators/test_windows_e2e.py"}


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples.{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.spark
@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW
                                  else p for p in EXAMPLES], ids=lambda p: p.stem)
def test_example_runs_and_equals_its_batch_recomputation(spark, tmp_path: Path, path: Path,
                                                         request: pytest.FixtureRequest
                                                         ) -> None:
    module = load(path)
    if "bootstrapServers" in inspect.signature(module.main).parameters:
        broker = request.getfixturevalue("kafka_broker")
        module.main(spark, tmp_path, broker.bootstrap, request.getfixturevalue("kafka_topic")(2))
    else:
        module.main(spark, tmp_path)


class Collected:
    """Where a producer's records go in the test below: a list, not a tracker."""

    def __init__(self) -> None:
        self.records: list[bytes] = []

    def send(self, records: list[bytes]) -> None:
        self.records.extend(records)


def test_retry_loop_stops_its_producers_when_the_example_raises() -> None:
    """An exception inside the example's producing block leaves no producer running."""
    producing = load(ROOT / "examples" / "retry_loop.py").producing
    before, fronts = set(threading.enumerate()), [Collected(), Collected()]
    with pytest.raises(RuntimeError, match="the query failed"), \
            producing(fronts, pauses_s=(0.001, 0.001)):
        while not all(f.records for f in fronts):
            time.sleep(0.01)
        raise RuntimeError("the query failed")
    assert set(threading.enumerate()) <= before
