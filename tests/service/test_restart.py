"""kill -9 in the middle: several agent processes, a subscriber, a retried batch.

After the restart the tracker must hold the exact state: no notification lost (a new
subscriber starts where the old ones were), none premature (a held-back item keeps the
sink's min time down across the restart), no batch applied twice (every window ends
balanced and the min time reaches the end).
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from lowtide.core.messages import Ack, AckBatch, MinTimeUpdate
from lowtide.service import Agent, TrackerService
from lowtide.service.persistence.state_dir import StateDirInUse
from lowtide.wire.frames import HEADER
from lowtide.wire.messages import Error, ErrorCode, FrontOp, Welcome
from tests.service.procs import (
    FRONT_OWNER,
    consumer,
    finish_held,
    graph,
    producer,
    serve,
    stop_processes,
    write_graph,
)
from tests.service.raw import RawClient

pytestmark = pytest.mark.socket

SLOTS = 16
HELD = 8  # front 0's slot whose sink receive waits until after the restart
FRONTS = (0, 1)


@pytest.mark.parametrize("snapshot_every_s", [30.0, 0.05], ids=["log-only", "snapshots"])
def test_kill9_restart_recovers_exact_state(tmp_path: Path, snapshot_every_s: float) -> None:
    ctx = multiprocessing.get_context("spawn")
    holding, release = ctx.Event(), ctx.Event()
    state = tmp_path / "state"
    args = ("--graph", str(write_graph(tmp_path)), "--state-dir", str(state))
    args += ("--snapshot-every-s", str(snapshot_every_s))
    procs: list[multiprocessing.process.BaseProcess] = []
    seen: list[MinTimeUpdate] = []
    with serve(tmp_path, *args) as first:
        url, port = first.url, first.port
        watcher = Agent.connect(url, graph())
        try:
            for front in FRONTS:  # all before any progress: none may start behind the min
                watcher.register_front(front, "src", 1, owner=FRONT_OWNER)
            watcher.on_update(seen.append, "sink")
            procs = [ctx.Process(target=producer, args=(url, f, SLOTS)) for f in FRONTS]
            work = (url, FRONTS, SLOTS, (0, HELD), holding, release)
            procs.append(ctx.Process(target=consumer, args=work))
            for p in procs:
                p.start()
            deadline = time.monotonic() + 30
            while (not seen or seen[-1].time < 3) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert seen and seen[-1].time >= 3, "no progress before the kill"
            first.kill9()  # agents are in the middle of sending
            before_kill = seen[-1].time
            # fire-and-forget while the server is down: sent once it is back, exactly once
            # (twice or never would leave this item in flight at the end)
            watcher.add_acks(AckBatch.of([Ack(0, SLOTS, 0xDEAD, 1)]))
            time.sleep(0.3)
            with serve(tmp_path, *args, "--port", str(port)) as second:
                watcher.add_acks(AckBatch.of([Ack(0, SLOTS, 0xDEAD, -1)]))
                watcher.flush()
                _run_after_restart(second.url, procs, holding, release, before_kill, seen)
                assert '"event": "recovered"' in second.log()
        finally:
            stop_processes(procs)
            watcher.close()


def _run_after_restart(
    url: str,
    procs: list[multiprocessing.process.BaseProcess],
    holding: Any,
    release: Any,
    before_kill: int,
    seen: list[MinTimeUpdate],
) -> None:
    _bad_client(url)
    assert seen[-1].time >= before_kill
    status = finish_held(url, procs, holding, release, HELD, SLOTS, seen)
    assert status["stuck"] == []


def _bad_client(url: str) -> None:
    """A client sending garbage and an illegal request: told why, nothing else happens."""
    bad = RawClient.open(url)
    try:
        assert isinstance(bad.hello(), Welcome)
        bad.send_raw(HEADER.pack(2) + b"\xee\xee")
        bad.send(FrontOp(1, 77, True, 5, "sink", 0))  # not a source segment
        codes = [bad.recv(), bad.recv()]
        assert [c.code for c in codes if isinstance(c, Error)] == [
            ErrorCode.BAD_FRAME,
            ErrorCode.PROTOCOL,
        ]
    finally:
        bad.close()


def test_one_state_dir_one_server(tmp_path: Path) -> None:
    first = TrackerService.start(graph(), state_dir=tmp_path)
    try:
        with pytest.raises(StateDirInUse):
            TrackerService.start(graph(), state_dir=tmp_path)
    finally:
        first.stop()
    TrackerService.start(graph(), state_dir=tmp_path).stop()  # free again
