"""One ingest log, two Spark queries: each is a consumer with its own ingest segment,
fronts send every record into both, both complete exactly, and retention deletes only
the log files both queries committed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.spark.sources.front import Front
from lowtide.spark.sources.ingest import IngestReader
from lowtide.spark.sources.log_source import LogSource
from lowtide.spark.sources.retention import consumers
from lowtide.spark.tracking import TRACK_COL, AckAccumulator, reference_slot
from lowtide.spark.tracking.transport import TrackerRef, connect

pytestmark = pytest.mark.spark
GRID = TimeGrid(delta_ms=10)
GRAPH = SegmentGraph.of(("ingest_a", ()), ("ingest_b", ()),
                        ("out_a", ("ingest_a",)), ("out_b", ("ingest_b",)))


def acking_sink(ref: TrackerRef, segment: str, seen: list[Any]) -> Any:
    """foreachBatch: receive each row out of ``segment`` by its tracking column."""
    from lowtide.service import BatchKey

    def sink(df: Any, batch_id: int) -> None:
        rows = df.select("front", "offset", TRACK_COL).toPandas()
        acc = AckAccumulator()
        acc.add_packed(GRAPH.index(segment), rows[TRACK_COL].to_numpy(np.int64),
                       reference_slot(GRID), -1)
        connect(ref).send_batch(BatchKey(segment, batch_id, segment, 0),
                                acc.build(GRID.window_slots))
        seen.extend(zip(rows["front"], rows["offset"], strict=True))

    return sink


def min_time(ref: TrackerRef, segment: str) -> int:
    status = connect(ref).status()
    return next(s["min_time"] for s in status["segments"] if s["segment"] == segment)


def wait_until(check: Any, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(check())


def test_two_queries_of_one_log_both_complete_and_retention_waits_for_both(
        spark, tmp_path: Path) -> None:
    from lowtide.service import TrackerService

    spark.dataSource.register(LogSource)
    log = tmp_path / "log"
    with TrackerService.start(GRAPH, grid=GRID) as svc:
        ref = TrackerRef(svc.url, GRAPH, GRID)
        fronts = [Front(log, f, ref, segment=("ingest_a", "ingest_b"), fsync="never",
                        heartbeat_ms=10, rotate_bytes=200) for f in (0, 1)]

        def produce(rounds: int) -> None:
            for i in range(rounds):
                for f in fronts:
                    f.send([b"%d:%d" % (f.front, i)] * 3)

        def start(name: str) -> Any:
            df = (spark.readStream.format("lowtide_log").option("path", str(log))
                  .option("lowtide.tracker", ref.to_option())
                  .option("lowtide.segment", f"ingest_{name}")
                  .option("lowtide.out", f"out_{name}").load())
            return (df.writeStream.foreachBatch(acking_sink(ref, f"out_{name}", seen[name]))
                    .option("checkpointLocation", str(tmp_path / f"ckpt_{name}"))
                    .trigger(processingTime="100 milliseconds").start())

        seen: dict[str, list[Any]] = {"a": [], "b": []}
        produce(6)
        queries = [start("a")]
        try:
            assert wait_until(lambda: len(seen["a"]) == 36)
            time.sleep(0.1)
            a_done = min(f.heartbeat() for f in fronts)
            assert wait_until(lambda: min_time(ref, "out_a") >= a_done)
            assert min_time(ref, "ingest_b") < a_done  # b has read nothing: only b waits
            assert IngestReader(log, 0).start_offset() == 0  # and b holds the log
            queries.append(start("b"))
            assert wait_until(lambda: len(seen["b"]) == 36)
            produce(6)  # the next batches commit the first ones: retention may delete
            assert wait_until(lambda: len(seen["a"]) == len(seen["b"]) == 72)
            assert wait_until(lambda: IngestReader(log, 0).start_offset() > 0)
        finally:
            for q in queries:
                q.stop()
        assert sorted(seen["a"]) == sorted(seen["b"]) and len(set(seen["b"])) == 72
        last = min(f.close() for f in fronts)
        assert wait_until(lambda: min(min_time(ref, "out_a"), min_time(ref, "out_b")) >= last)
        committed = consumers(log)
        assert set(committed) == {"ingest_a", "ingest_b"}
        for f in (0, 1):  # deleted only what both committed
            both = min(committed[c][f] for c in committed)
            assert 0 < IngestReader(log, f).start_offset() <= both
        connect(ref).close()
