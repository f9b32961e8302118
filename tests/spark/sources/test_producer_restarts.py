"""Issue 29 point 2: a producer that stops before its send-acks reach the tracker, with
real processes. A producer writes labelled records to a "topic" (a file), then dies
inside the agent's flush interval (SIGKILL), or exits 0 while the standalone tracker
is down; a successor with the same front and owner starts. The consumer then receives
every record the first process wrote: its receipt is never refused as behind the
head, and no min time passed a written record before the consumer read it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service import Agent
from lowtide.spark.sources.front import Front
from lowtide.spark.sources.labels import from_label
from lowtide.spark.tracking.transport import TrackerRef, connect
from tests.service.procs import serve, write_graph
from tests.spark.sources.helpers import consume, wait_for_min

pytestmark = pytest.mark.socket
GRID = TimeGrid(delta_ms=10)
GRAPH = SegmentGraph.of(("src", ()), ("sink", ("src",)))
OWNER = "gateway-1"

# The first producer: writes each labelled batch to the topic file, then "written".
PRODUCER = """
import json, os, signal, sys
from lowtide.spark.sources.front import Front
from lowtide.spark.tracking.transport import TrackerRef, connect
ref, topic, how = TrackerRef.from_option(sys.argv[1]), sys.argv[2], sys.argv[3]
front = Front(None, 1, ref, segment="src", heartbeat_ms=5, owner="gateway-1",
              confirm_timeout_s=2)

def produce(records):
    batch = front.label(records)
    with open(topic, "a") as f:  # the write reached the topic
        f.write(json.dumps({"times": batch.times.tolist(), "acks": batch.acks.tolist()}))
        f.write("\\n")
        f.flush()
        os.fsync(f.fileno())
    front.written(batch)

produce([b"a", b"b"])
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)  # inside the agent's 5 ms flush interval
print("ready", flush=True)
sys.stdin.readline()  # the test stopped the tracker
try:
    produce([b"c", b"d", b"e"])
except Exception as exc:  # durable send-acks: nothing is written without them
    print("refused", type(exc).__name__, flush=True)
sys.exit(0)
"""


def written(topic: Path) -> tuple[np.ndarray, np.ndarray]:
    """(times, root acks) of every record the first producer wrote."""
    rows = [json.loads(line) for line in topic.read_text().splitlines()]
    times = np.array([t for r in rows for t in r["times"]], np.int64)
    acks = from_label(np.array([a for r in rows for a in r["acks"]], np.int64))
    return times, acks


def src_min(agent: Agent) -> int:
    return int(agent.status()["segments"][0]["min_time"])


def check_successor(ref: TrackerRef, agent: Agent, topic: Path) -> None:
    """The successor heartbeats past the written records; the min times wait for the
    consumer, whose receipt is accepted; then they pass every record."""
    successor = Front(None, 1, ref, segment="src", heartbeat_ms=5, owner=OWNER)
    try:
        time.sleep(0.5)  # the successor's heartbeats are well past the records now
        times, acks = written(topic)
        assert len(times) > 0
        assert src_min(agent) <= int(times.min())  # nothing written was passed
        consume(agent, times, acks)  # never AckBehindHead
        assert wait_for_min(agent, 1, int(times.max())) > int(times.max())
    finally:
        successor.close()
        connect(ref).close()  # the fronts' agent, before the tracker stops


def test_a_producer_killed_inside_the_flush_interval(tmp_path: Path) -> None:
    from lowtide.service import TrackerService

    topic = tmp_path / "topic.jsonl"
    with TrackerService.start(GRAPH, grid=GRID) as svc:
        ref = TrackerRef(svc.url, GRAPH, GRID)
        run = subprocess.run([sys.executable, "-c", PRODUCER, ref.to_option(), str(topic),
                              "kill"], capture_output=True, text=True, timeout=120)
        assert run.returncode == -9, run.stderr
        with Agent.connect(svc.url, GRAPH) as agent:
            check_successor(ref, agent, topic)


def test_a_producer_that_exits_while_the_tracker_is_down(tmp_path: Path) -> None:
    topic = tmp_path / "topic.jsonl"
    args = ("--graph", str(write_graph(tmp_path)), "--state-dir", str(tmp_path / "state"))
    with serve(tmp_path, *args) as first:
        ref = TrackerRef(first.url, GRAPH, GRID)
        producer = subprocess.Popen(
            [sys.executable, "-c", PRODUCER, ref.to_option(), str(topic), "outage"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert producer.stdout is not None and producer.stdin is not None
            assert producer.stdout.readline().strip() == "ready"
            first.kill9()
            producer.stdin.write("go\n")
            producer.stdin.flush()
            out, err = producer.communicate(timeout=60)
        finally:
            if producer.poll() is None:
                producer.kill()
            producer.wait(10)
        assert producer.returncode == 0, err
        assert "refused TimeoutError" in out  # the second batch was not written
        with serve(tmp_path, *args, "--port", str(first.port)) as second:
            ref = TrackerRef(second.url, GRAPH, GRID)
            with Agent.connect(second.url, GRAPH) as agent:
                check_successor(ref, agent, topic)


LIVE_PRODUCER = """
import sys, time
from lowtide.spark.sources.front import Front
from lowtide.spark.tracking.transport import TrackerRef
front = Front(None, 1, TrackerRef.from_option(sys.argv[1]), segment="src", heartbeat_ms=5,
              owner="gateway-1")
print("ready", flush=True)
time.sleep(60)
"""


def test_a_second_live_producer_with_the_same_owner_is_refused() -> None:
    """Two producers started with one front id and the same owner name (one program
    run twice on one host derives the same owner): while the first is live, the second
    is refused; once the first is gone, a successor takes over."""
    from lowtide.core.errors import FrontHeld
    from lowtide.service import TrackerService

    with TrackerService.start(GRAPH, grid=GRID) as svc:
        ref = TrackerRef(svc.url, GRAPH, GRID)
        first = subprocess.Popen([sys.executable, "-c", LIVE_PRODUCER, ref.to_option()],
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert first.stdout is not None and first.stdout.readline().strip() == "ready"
            with Agent.connect(svc.url, GRAPH) as second, pytest.raises(FrontHeld):
                second.register_front(1, "src", 10**12, owner=OWNER)
            assert svc.status()["fronts"]["1"][1] < 10**12  # the first keeps its front
        finally:
            first.kill()
            first.wait(10)
        successor = Front(None, 1, ref, segment="src", heartbeat_ms=5, owner=OWNER)
        successor.close()
        connect(ref).close()
