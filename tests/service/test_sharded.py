"""`lowtide serve --shards 2`: agents in separate processes, a shard killed with -9
in the middle, a keyed batch split across shards and completed by a retry."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from lowtide.core.messages import Ack, AckBatch, Heartbeat, MinTimeUpdate
from lowtide.service import Agent, BatchKey, CallerAgent
from lowtide.service.client.batches import stream_time
from lowtide.wire.messages import Batch, Ok, Welcome
from tests.service.procs import (
    FRONT_OWNER,
    consumed,
    consumer,
    graph,
    produced,
    producer,
    serve,
    shard_pids,
    stop_processes,
    wait_until,
    write_graph,
)
from tests.service.raw import RawClient

pytestmark = pytest.mark.socket

SLOTS = 12
HELD = 6
FRONTS = (0, 1)


def test_sharded_cluster_survives_a_shard_kill(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    holding, release = ctx.Event(), ctx.Event()
    args = ("--graph", str(write_graph(tmp_path)), "--shards", "2")
    args += ("--state-dir", str(tmp_path / "state"))
    procs: list[Any] = []
    seen: list[MinTimeUpdate] = []
    with serve(tmp_path, *args) as coordinator:
        url = coordinator.url
        watcher = Agent.connect(url, graph())
        try:
            for front in FRONTS:
                watcher.register_front(front, "src", 1, owner=FRONT_OWNER)
            watcher.on_update(seen.append, None)
            victim = shard_pids(watcher)[1]
            procs = [ctx.Process(target=producer, args=(url, f, SLOTS)) for f in FRONTS]
            work = (url, FRONTS, SLOTS, (0, HELD), holding, release)
            procs.append(ctx.Process(target=consumer, args=work))
            for p in procs:
                p.start()
            wait_until(lambda: seen and seen[-1].time >= 3)
            os.kill(victim, signal.SIGKILL)  # the coordinator restarts it from its log
            assert holding.wait(60)
            for p in procs[:2]:
                p.join(60)
                assert p.exitcode == 0
            assert max(u.time for u in seen) <= HELD  # the held item keeps everything back
            release.set()
            with watcher.subscribe("sink") as sink:
                assert sink.wait_for(SLOTS + 1, 30).time == SLOTS + 1
            procs[2].join(30)
            assert procs[2].exitcode == 0
            assert shard_pids(watcher)[1] != victim
            key = BatchKey("q", 1, "src", 0)
            assert watcher.send_batch(key, produced(0, 1)) is False  # a retry, on both shards
            with CallerAgent.connect(url, graph()) as task:  # a Spark task's agent
                assert task.grid  # ready: its batches go out from the calling thread
                assert task.send_batch(key, produced(0, 1)) is False
            _split_batch_is_completed_by_a_retry(watcher)
        finally:
            stop_processes(procs)
            watcher.close()
    assert [u.time for u in seen] == sorted({u.time for u in seen})


def _split_batch_is_completed_by_a_retry(agent: Agent) -> None:
    """A task sends keyed batch K: the receive of X (t=40, shard 0's window) and the send
    of its child Y (t=41, shard 1's). It dies after reaching shard 0 only; until a retry
    of K reaches shard 1, nothing may claim that Y's segment is complete past 40."""
    x, y = 0xA1, 0xB2
    agent.send_batch(BatchKey("t", 0, "src", 0), AckBatch.of([Ack(0, 40, x, 1)]))
    key = BatchKey("t", 1, "sink", 0)
    batch = AckBatch.of([Ack(1, 41, y, 1), Ack(0, 40, x, -1)])
    shard0 = agent.status()["shards"][0]["url"]
    dying = RawClient.open(shard0)
    try:
        assert isinstance(dying.hello(shard=(0, 2)), Welcome)
        part = batch.take(batch.time == 40)
        dying.send(Batch(1, 424242, key.text(), part, (), stream_time(key, 40)))
        assert dying.recv() == Ok(1)
    finally:
        dying.close()
    with agent.subscribe("sink") as sink:
        for front in FRONTS:
            agent.heartbeat(front, 50)
        agent.flush()
        time.sleep(0.5)
        assert agent.status()["segments"][1]["min_time"] <= 40
        assert agent.send_batch(key, batch) is True  # new on shard 1, a duplicate on shard 0
        agent.send_batch(BatchKey("t", 1, "out", 0), AckBatch.of([Ack(1, 41, y, -1)]))
        assert sink.wait_for(50, 10).time == 50
    status = wait_until(lambda: (s := agent.status())["segments"][1]["in_flight"] == 0 and s)
    assert status["global_min"] == 50


def test_coordinator_kill9_restart(tmp_path: Path) -> None:
    """The coordinator dies; its shards notice and exit; a new one starts them again from
    their state. The agent learns the new shard addresses and carries on."""
    args = ("--graph", str(write_graph(tmp_path)), "--shards", "2")
    args += ("--state-dir", str(tmp_path / "state"))
    with serve(tmp_path, *args) as first:
        agent = Agent.connect(first.url, graph())
        try:
            agent.register_front(0, "src", 1)
            _one_slot(agent, 1)
            first.kill9()
            with serve(tmp_path, *args, "--port", str(first.port)):
                _one_slot(agent, 2)
                key = BatchKey("q", 1, "src", 0)
                assert agent.send_batch(key, produced(0, 1)) is False  # the shards remember
                status = wait_until(lambda: (s := agent.status())["shards"][0]["status"] and s)
                assert status["global_min"] == 3
        finally:
            agent.close()


def _one_slot(agent: Agent, slot: int) -> None:
    agent.send_batch(BatchKey("q", slot, "src", 0), produced(0, slot), [Heartbeat(0, slot + 1)])
    first, second = consumed(0, slot)
    agent.send_batch(BatchKey("q", slot, "sink", 0), first)
    agent.send_batch(BatchKey("q", slot, "out", 0), second)
    with agent.subscribe(None) as sub:
        assert sub.wait_for(slot + 1, 30).time == slot + 1
