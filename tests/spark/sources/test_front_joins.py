"""A consumer attached to a log while its fronts run (rule 16), against a real tracker
service and no Spark: the running front joins it between batches (no restart) and
answers where it starts; the consumer reads from there, so the front's acks and the
consumer's reads are the same records (rule 5) and its segment completes; a released
consumer is left; a front killed (SIGKILL) while a consumer attaches: its successor
joins or resumes it, and the new segment never passes a record it did not receive; a
join the tracker refuses (the segment detached meanwhile) fails closed, said once."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service import Agent
from lowtide.spark.sources.front import Front
from lowtide.spark.sources.joins import request_join, start_offsets
from lowtide.spark.sources.log_source import FrontPartition, read_log_partition
from lowtide.spark.sources.retention import register_consumer, release_consumer
from lowtide.spark.tracking import AckAccumulator
from lowtide.spark.tracking.transport import TrackerRef, connect
from tests.spark.sources.helpers import segment, stop_producer, wait_for

pytestmark = pytest.mark.socket
GRID = TimeGrid(delta_ms=10)
GRAPH = SegmentGraph.of(("ingest", ()), ("sink", ("ingest",)))
LATE = [("ingest_x", ()), ("sink_x", ("ingest_x",))]


@contextlib.contextmanager
def log_front(tmp_path: Path) -> Iterator[tuple[Any, TrackerRef, Agent, Front]]:
    """A tracker service, an agent that changes its graph, and front 0 of the log
    ``tmp_path/log`` (heartbeats by hand); all stopped at the end."""
    from lowtide.service import TrackerService

    with TrackerService.start(GRAPH, grid=GRID) as svc:
        ref = TrackerRef(svc.url, GRAPH, GRID)
        agent = Agent.connect(svc.url, GRAPH)
        front = Front(tmp_path / "log", 0, ref, fsync="never", heartbeat_ms=None)
        try:
            yield svc, ref, agent, front
        finally:
            front.close()
            agent.close()
            connect(ref).close()


def consume(agent: Agent, log: Path, front: int, start: int, end: int) -> int:
    """The new consumer's receipt of ``[start, end)`` out of ``ingest_x``; returns the
    highest time it read."""
    _batch, times, acks = read_log_partition(str(log), FrontPartition(front, start, end))
    acc = AckAccumulator()
    acc.add(agent.graph.index("ingest_x"), times, acks, -1)
    agent.add_acks(acc.build(GRID.window_slots))
    agent.flush()
    return int(times.max())


def test_a_running_front_joins_a_consumer_attached_to_its_log(tmp_path: Path) -> None:
    with log_front(tmp_path) as (svc, _ref, agent, front):
        log = tmp_path / "log"
        front.send([b"a", b"b", b"c"])        # before the consumer: never acked for it
        agent.change_graph(attach=LATE)       # the tracker attaches its segments ...
        register_consumer(log, "ingest_x", {0: 0})
        request_join(log, "ingest_x", consumer="ingest_x")  # ... and it asks to be fed
        assert start_offsets(log, "ingest_x", [0]) == {0: None}  # waits for front 0
        time.sleep(0.03)
        front.heartbeat()                     # between batches: it follows the log dir
        assert front.segments == ("ingest", "ingest_x")
        assert start_offsets(log, "ingest_x", [0]) == {0: 3}
        first = front.send([b"d", b"e"])
        assert first == 3
        time.sleep(0.05)
        beat = front.heartbeat()
        wait_for(lambda: segment(svc, "ingest_x")["bound"] >= beat)
        x = segment(svc, "ingest_x")
        assert x["in_flight"] == 2            # d and e, sent into it, not yet read
        last = consume(agent, log, 0, 3, 5)
        assert x["min_time"] <= last           # never past what it had not received
        time.sleep(0.05)
        beat = front.heartbeat()
        wait_for(lambda: segment(svc, "ingest_x")["min_time"] > last)
        assert segment(svc, "ingest_x")["in_flight"] == 0


def test_a_released_consumer_is_left_and_its_detach_refuses_nothing(tmp_path: Path) -> None:
    from lowtide.service import TrackerService

    log = tmp_path / "log"
    with TrackerService.start(GRAPH, grid=GRID) as svc:
        ref = TrackerRef(svc.url, GRAPH, GRID)
        agent = Agent.connect(svc.url, GRAPH)
        agent.change_graph(attach=LATE)
        register_consumer(log, "ingest_x", {0: 0})
        request_join(log, "ingest_x", consumer="ingest_x")
        front = Front(log, 0, ref, fsync="never", heartbeat_ms=5)
        try:
            wait_for(lambda: front.segments == ("ingest", "ingest_x"))
            front.send([b"a"])
            release_consumer(log, "ingest_x")     # the query was detached (rule 16)
            wait_for(lambda: front.segments == ("ingest",))
            # it unregistered there (just after it stopped sending there)
            wait_for(lambda: str(1 << 32) not in svc.status()["fronts"])
            agent.change_graph(detach=["sink_x", "ingest_x"])
            front.send([b"b"])                    # nothing refused: no ack goes there
            time.sleep(0.05)
            beat = front.heartbeat()
            front.flush()                         # nor any heartbeat
            wait_for(lambda: segment(svc, "ingest")["bound"] >= beat)
        finally:
            front.close()
            agent.close()
            connect(ref).close()


PRODUCER = """
import sys, time
from lowtide.spark.sources.front import Front
from lowtide.spark.tracking.transport import TrackerRef
front = Front(sys.argv[2], 0, TrackerRef.from_option(sys.argv[1]), fsync="always",
              heartbeat_ms=5)
front.send([b"r%d" % i for i in range(5)])
print("sent", flush=True)
time.sleep(600)   # heartbeats and follows the log dir until it is killed
"""


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_front_killed_while_a_consumer_attaches_is_never_premature(
        tmp_path: Path, seed: int) -> None:
    from lowtide.service import TrackerService

    log = tmp_path / "log"
    with TrackerService.start(GRAPH, grid=GRID) as svc:
        ref = TrackerRef(svc.url, GRAPH, GRID)
        agent = Agent.connect(svc.url, GRAPH)
        producer = subprocess.Popen([sys.executable, "-c", PRODUCER, ref.to_option(), str(log)],
                                    stdout=subprocess.PIPE, text=True)
        successor = None
        try:
            assert producer.stdout is not None and producer.stdout.readline() == "sent\n"
            agent.change_graph(attach=LATE)
            register_consumer(log, "ingest_x", {0: 0})
            request_join(log, "ingest_x", consumer="ingest_x")
            time.sleep(random.Random(seed).uniform(0.0, 0.4))  # before, during or after its join
            producer.kill()
            producer.wait()
            successor = Front(log, 0, ref, fsync="never", heartbeat_ms=5)  # same owner: the log
            wait_for(lambda: "ingest_x" in successor.segments)
            (start,) = start_offsets(log, "ingest_x", [0]).values()
            assert start is not None and start >= 5  # the killed front's records: not its
            end = successor.send([b"s%d" % i for i in range(4)]) + 4
            time.sleep(0.1)
            held = segment(svc, "ingest_x")
            _b, times, _a = read_log_partition(str(log), FrontPartition(0, start, end))
            assert held["in_flight"] == end - start  # exactly what it will read
            assert held["min_time"] <= int(times.min())  # never past an unread record
            last = consume(agent, log, 0, start, end)
            wait_for(lambda: segment(svc, "ingest_x")["min_time"] > last)
            assert not svc.status()["stuck"]
            joins = json.loads((log / "joins" / "ingest_x" / "f0.json").read_text())
            assert joins["offset"] == start and joins["front_id"] == 1 << 32
        finally:
            stop_producer(producer, successor, agent, ref)


def test_a_consumer_reads_each_front_from_its_answer_and_waits_for_the_others(
        tmp_path: Path) -> None:
    """The reader's offsets (no tracker): front 0 answered at offset 2, front 1 feeds
    another consumer only (wait: its offset stays), front 2 never answered anything (a
    log written before joins existed: from its start)."""
    from lowtide.spark.sources.ingest import IngestWriter
    from lowtide.spark.sources.joins import Join, record_join
    from lowtide.spark.sources.log_source import log_offsets, log_partitions

    for f in (0, 1, 2):
        with IngestWriter(tmp_path, f, fsync="never") as w:
            w.append([b"x"] * 4, time=10)
    record_join(tmp_path, "ingest_x", front=0, join=Join(2, 11, 1 << 32))
    record_join(tmp_path, "ingest", front=1, join=Join(0, -1, 1))
    first = start_offsets(tmp_path, "ingest_x", [0, 1, 2])
    assert first == {0: 2, 1: None, 2: 0}
    start = {"f0": 0, "f1": 0, "f2": 0}
    end = log_offsets(str(tmp_path), [0, 1, 2], start, None, first)
    assert end == {"f0": 4, "f1": 0, "f2": 4}
    parts = [(p.front, p.start, p.end) for p in log_partitions(start, end, first)]
    assert parts == [(0, 2, 4), (2, 0, 4)]


def test_a_consumer_that_attaches_during_a_tracker_restart_is_joined_after_it(
        tmp_path: Path) -> None:
    """The tracker (``lowtide serve``) is killed (SIGKILL) and the consumer asks while
    it is down: the front cannot learn the new generation and tries again; once the
    tracker is back (generation 1 recovered from its state dir) it joins, and the new
    segment completes exactly what the consumer reads."""
    from tests.service.procs import serve

    log, state = tmp_path / "log", tmp_path / "state"
    graph_file = tmp_path / "graph.json"
    graph_file.write_text(json.dumps([["ingest", []], ["sink", ["ingest"]]]))
    args = ("--state-dir", str(state), "--graph", str(graph_file))
    with serve(tmp_path, *args) as first:         # stops its agents when it ends
        ref = TrackerRef(first.url, GRAPH, GRID)
        with Agent.connect(first.url, GRAPH) as attaching:
            attaching.change_graph(attach=LATE)   # generation 1, logged
        front = Front(log, 0, ref, fsync="never", heartbeat_ms=5)
        try:
            front.send([b"a", b"b"])
            first.kill9()                         # the tracker is down ...
            register_consumer(log, "ingest_x", {0: 0})
            request_join(log, "ingest_x", consumer="ingest_x")  # ... when it asks
            time.sleep(0.5)
            assert front.segments == ("ingest",)
            assert start_offsets(log, "ingest_x", [0]) == {0: None}
            with serve(tmp_path, *args, "--port", str(first.port)) as second:
                wait_for(lambda: front.segments == ("ingest", "ingest_x"), timeout_s=60)
                (start,) = start_offsets(log, "ingest_x", [0]).values()
                assert start == 2
                end = front.send([b"c", b"d", b"e"]) + 3
                with Agent.connect(second.url, GRAPH) as agent:
                    agent.follow_graph()
                    time.sleep(0.1)
                    x = next(s for s in agent.status()["segments"]
                             if s["segment"] == "ingest_x")
                    assert x["in_flight"] == 3
                    assert x["min_time"] <= front.status()["max_label"]
                    last = consume(agent, log, 0, start, end)
                    wait_for(lambda: next(s for s in agent.status()["segments"]
                                          if s["segment"] == "ingest_x")["min_time"] > last)
                front.close()
        finally:
            front.close()


def test_a_refused_join_fails_closed_in_one_line_and_is_not_asked_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The consumer's segment is detached on the tracker after the front's agent learnt
    of it and before the front registers there (issue 34 review): the registration is
    refused; the front does not join (no answer, nothing labelled or acked into it),
    says so in one warning line, learns the tracker's generation and does not ask the
    tracker again; its own segment completes what its consumer reads."""
    with log_front(tmp_path) as (svc, ref, agent, front):
        log = tmp_path / "log"
        front.send([b"a", b"b"])
        agent.change_graph(attach=LATE)
        connect(ref).follow_graph()          # the front's agent has generation 1 ...
        agent.change_graph(detach=["sink_x", "ingest_x"])  # ... the tracker 2 now
        register_consumer(log, "ingest_x", {0: 0})
        request_join(log, "ingest_x", consumer="ingest_x")
        caplog.set_level(logging.INFO, logger="lowtide")
        for _ in range(4):                   # the heartbeat follows the log dir
            time.sleep(0.21)
            front.heartbeat()
        said = [r for r in caplog.records if r.name == "lowtide.spark.front"]
        (line,) = [r.getMessage() for r in said]   # one line, said once
        assert line.startswith("consumers not followed: front=0, error=front 0 did not "
                               "join consumer 'ingest_x'")
        assert "is detached" in line and "\n" not in line
        refused = [r for r in caplog.records if "refused request" in r.getMessage()]
        assert len(refused) == 1             # asked once: it learnt the generation
        assert front.segments == ("ingest",)
        assert start_offsets(log, "ingest_x", [0]) == {0: None}  # its reader waits
        assert str(1 << 32) not in svc.status()["fronts"]
        first = front.send([b"c"])           # labelled into its own segment only
        time.sleep(0.05)
        beat = front.heartbeat()
        front.flush()                        # no ack or heartbeat was refused
        wait_for(lambda: segment(svc, "ingest")["bound"] >= beat)
        held = segment(svc, "ingest")
        assert held["in_flight"] == first + 1 and held["min_time"] <= beat
