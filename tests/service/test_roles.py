"""Rights follow roles, and a shard is only believed as itself (issue 29, point 14): a
shard took ShardReleaseFrame from any admitted peer, and a dead shard's port, taken
over by another process, stopped the cluster for good. Real shards on real sockets;
the takeover against `lowtide serve --shards 2` and a real squatter on the port."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import ShardRelease
from lowtide.service import Agent, TrackerService
from lowtide.wire.messages import (
    Error,
    ErrorCode,
    FrontOp,
    Ok,
    Role,
    ShardReleaseFrame,
    ShardReportFrame,
    StatusRequest,
    WatchShard,
)
from tests.service.procs import (
    FRONT_OWNER,
    consumer,
    graph,
    producer,
    serve,
    shard_pids,
    wait_until,
    write_graph,
)
from tests.service.raw import RawClient

pytestmark = pytest.mark.socket

GRAPH = SegmentGraph.of(("src", ()), ("sink", ("src",)))


@pytest.fixture
def shard_url() -> Iterator[str]:
    with TrackerService.start(GRAPH, shard=(0, 2)) as svc:
        yield svc.url


def test_only_a_coordinator_may_release_or_watch_a_shard(shard_url: str) -> None:
    agent = RawClient.welcomed(shard_url, shard=(0, 2))
    coordinator = RawClient.welcomed(shard_url, Role.COORDINATOR, (0, 2))
    try:
        release = ShardReleaseFrame(ShardRelease((1 << 40, 1 << 40)), ((7, 1 << 30),))
        agent.send(release)
        refused = agent.recv(timeout_s=3)
        assert isinstance(refused, Error) and refused.code == ErrorCode.FORBIDDEN
        assert "agent may not send ShardReleaseFrame" in refused.message
        watched = agent.ask(WatchShard(2))
        assert isinstance(watched, Error) and watched.code == ErrorCode.FORBIDDEN
        assert coordinator.ask(WatchShard(3)) == Ok(3)
        report = coordinator.recv()
        assert isinstance(report, ShardReportFrame) and max(report.report.min_times) < 1 << 40
        forbidden = coordinator.ask(FrontOp(4, 9, True, 1, "src", 0))  # nor the reverse
        assert isinstance(forbidden, Error) and forbidden.code == ErrorCode.FORBIDDEN
    finally:
        agent.close()
        coordinator.close()


def test_a_status_client_only_reads(service: TrackerService) -> None:
    status = RawClient.welcomed(service.url, Role.STATUS)
    try:
        refused = status.ask(FrontOp(1, 9, True, 1, "src", 0))
        assert isinstance(refused, Error) and refused.code == ErrorCode.FORBIDDEN
        assert status.ask(StatusRequest(2)).req == 2  # type: ignore[union-attr]
    finally:
        status.close()


def test_a_shard_refuses_clients_that_did_not_ask_for_it(shard_url: str) -> None:
    for shard in (None, (1, 2), (0, 3)):
        client = RawClient.open(shard_url)
        try:
            err = client.hello(shard=shard)
            assert isinstance(err, Error) and err.code == ErrorCode.SHARD_MISMATCH
        finally:
            client.close()
    assert RawClient.welcomed(shard_url, Role.STATUS).close() is None  # status may look


# ------------------------------------------------------------ a shard's port taken over
SLOTS = 10
FRONTS = (0, 1)


def squat(port: int, timeout_s: float = 3.0) -> socket.socket | None:
    """Listen on ``port`` as soon as it is free (None if its shard came back first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            return sock
        except OSError:
            sock.close()
            time.sleep(0.005)
    return None


def test_a_shard_whose_port_was_taken_moves_and_everyone_follows(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    holding, release = ctx.Event(), ctx.Event()
    args = ("--graph", str(write_graph(tmp_path)), "--shards", "2",
            "--state-dir", str(tmp_path / "state"))
    procs: list[Any] = []
    squatter = None
    with serve(tmp_path, *args) as coordinator, Agent.connect(coordinator.url, graph()) as watcher:
        try:
            for front in FRONTS:
                watcher.register_front(front, "src", 1, owner=FRONT_OWNER)
            procs = [ctx.Process(target=producer, args=(coordinator.url, f, SLOTS))
                     for f in FRONTS]
            procs.append(ctx.Process(target=consumer, args=(
                coordinator.url, FRONTS, SLOTS, (0, 4), holding, release)))
            for p in procs:
                p.start()
            old = watcher.status()["shards"][0]["url"]
            port = int(old.rsplit(":", 1)[1])
            while squatter is None:  # kill shard 0 and take its port before it is back
                os.kill(shard_pids(watcher)[0], signal.SIGKILL)
                squatter = squat(port)
            assert holding.wait(60)
            release.set()
            with watcher.subscribe("sink") as sink:
                assert sink.wait_for(SLOTS + 1, 60).time == SLOTS + 1
            for p in procs:
                p.join(30)
                assert p.exitcode == 0
            moved = wait_until(lambda: watcher.status()["shards"][0]["url"] != old)
            assert moved
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                p.join(10)
            if squatter is not None:
                with contextlib.suppress(OSError):
                    squatter.close()
    assert "shard port taken by another process: shard moved" in coordinator.log()
