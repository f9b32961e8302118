"""A producer process killed (SIGKILL) between label and write, against a real tracker
service: its successor heartbeats on, and the ingest segment still never passes the
records that were acked but never written; the tracker reports them missing."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.spark.sources.front import Front
from lowtide.spark.tracking.transport import TrackerRef, connect

pytestmark = pytest.mark.socket
GRID = TimeGrid(delta_ms=10)
GRAPH = SegmentGraph.of(("ingest", ()), ("sink", ("ingest",)))

PRODUCER = """
import json, os, signal, sys
from lowtide.spark.sources.front import Front
from lowtide.spark.tracking.transport import TrackerRef
front = Front(None, 1, TrackerRef.from_option(sys.argv[1]), heartbeat_ms=5, owner="gw")
batch = front.label([b"a", b"b"])  # acked, confirmed by the tracker
print(json.dumps({"times": batch.times.tolist()}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # ... and never written
"""


def test_a_producer_killed_between_label_and_write_is_reported_missing() -> None:
    from lowtide.service import TrackerService

    with TrackerService.start(GRAPH, grid=GRID, stuck_after_ms=200) as svc:
        ref = TrackerRef(svc.url, GRAPH, GRID)
        run = subprocess.run([sys.executable, "-c", PRODUCER, ref.to_option()],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == -9, run.stderr
        (slot,) = set(json.loads(run.stdout)["times"])
        successor = Front(None, 1, ref, heartbeat_ms=5, owner="gw")  # the restarted producer
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not svc.status()["stuck"]:
                time.sleep(0.05)
            status = svc.status()
            (stuck,) = status["stuck"]
            ingest = next(s for s in status["segments"] if s["segment"] == "ingest")
            assert ingest["min_time"] <= slot < successor.heartbeat()
            assert ingest["sent"] == 2 and ingest["received"] == 0
            assert stuck.startswith(f"segment 'ingest', slots [{slot}, ")
            assert stuck.endswith("2 item(s) missing")
        finally:
            successor.close()
            connect(ref).close()
