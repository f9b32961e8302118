"""Recovery trusts only what it can prove (issue 21, points 2, 7 and 8): real state
dirs, real damaged files, a real write limit standing in for a full disk."""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import Ack, AckBatch, Heartbeat
from lowtide.core.time import TimeGrid
from lowtide.service import Agent, BatchKey, TrackerService
from lowtide.service.persistence.state_dir import StateDirRefused

pytestmark = pytest.mark.socket

GRAPH = SegmentGraph.of(("src", ()), ("sink", ("src",)))


def run(state: Path, first_batch: int, batches: int = 6, **options: object) -> None:
    """One server life: a front and ``batches`` keyed batches, one log group each. (Each
    life's agent is a new session of the front's owner: no lease, so it takes over at
    once.)"""
    options.setdefault("front_lease_ms", 0)
    svc = TrackerService.start(GRAPH, state_dir=state, **options)  # type: ignore[arg-type]
    try:
        with Agent.connect(svc.url, GRAPH) as agent:
            agent.register_front(1, "src", first_batch, owner="test")
            for b in range(first_batch, first_batch + batches):
                acks = AckBatch.of([Ack(0, b, b + 1, 1), Ack(0, b, b + 1, -1)])
                agent.send_batch(BatchKey("q", b, "src", 0), acks, [Heartbeat(1, b + 1)])
    finally:
        svc.stop()


def recovered_min(state: Path) -> int:
    svc = TrackerService.start(GRAPH, state_dir=state)
    try:
        with Agent.connect(svc.url, GRAPH) as agent:
            return int(agent.status()["global_min"])
    finally:
        svc.stop()


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.fixture
def two_files(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    run(state, 0)
    run(state, 6)  # a restart starts a second log file
    assert len(wal_files(state)) == 2
    return state


def wal_files(state: Path) -> list[Path]:
    return sorted(state.glob("wal-*.log"))


# ------------------------------------------------------------ point 2: damaged logs
def test_torn_tail_of_the_last_file_is_dropped(two_files: Path) -> None:
    last = wal_files(two_files)[-1]
    os.truncate(last, last.stat().st_size - 3)  # the last group's write cut short
    assert recovered_min(two_files) == 12 - 1  # all but the torn last batch
    assert recovered_min(two_files) == 11  # and it stays recoverable (tail cut off)


@pytest.mark.parametrize("which", [0, -1], ids=["first", "last"])
def test_a_flipped_byte_mid_file_refuses_to_start(two_files: Path, which: int) -> None:
    path = wal_files(two_files)[which]
    flip(path, path.stat().st_size // 2)
    why = rf"{path.name}: .* \(at byte \d+\).*backup"
    with pytest.raises(StateDirRefused, match=why) as info:
        TrackerService.start(GRAPH, state_dir=two_files)
    assert "\n" not in str(info.value)


def test_a_torn_first_file_refuses_to_start(two_files: Path) -> None:
    first = wal_files(two_files)[0]
    os.truncate(first, first.stat().st_size - 3)
    with pytest.raises(StateDirRefused, match=first.name):
        TrackerService.start(GRAPH, state_dir=two_files)


def test_serve_says_why_in_one_line(two_files: Path, tmp_path: Path) -> None:
    flip(wal_files(two_files)[0], 30)
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps([["src", []], ["sink", ["src"]]]))
    cmd = [sys.executable, "-m", "lowtide.cli", "serve", "--port", "0", "--graph", str(graph),
           "--state-dir", str(two_files)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    lines = [line for line in done.stderr.splitlines() if "lowtide serve:" in line]
    assert len(lines) == 1 and "wal-00000001.log" in lines[0] and "Traceback" not in done.stderr


def test_a_sharded_deployment_says_why_in_one_line(tmp_path: Path) -> None:
    """A shard that refuses its state dir stops the coordinator at once (no retries)."""
    shard = tmp_path / "state" / "shard-0"
    shard.mkdir(parents=True)
    (shard / "wal-00000001.log").write_bytes(b"")  # a log, but nothing says whose
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps([["src", []], ["sink", ["src"]]]))
    cmd = [sys.executable, "-m", "lowtide.cli", "serve", "--port", "0", "--graph", str(graph),
           "--state-dir", str(tmp_path / "state"), "--shards", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert "Traceback" not in done.stderr
    assert "state.json: missing" in done.stderr and "retrying cannot help" in done.stderr


def test_replay_forgets_batch_keys_when_the_server_did(tmp_path: Path) -> None:
    """Dedup keys expire with the requests (logged), not with the clock's ticks: a key
    that expired before a resend was applied again, so the replay must apply it again."""
    state = tmp_path / "state"
    key, acks = BatchKey("q", 0, "src", 0), AckBatch.of([Ack(0, 5, 0xA, 1)])
    svc = TrackerService.start(GRAPH, state_dir=state, dedup_retention_ms=100)
    try:
        with Agent.connect(svc.url, GRAPH) as agent:
            agent.register_front(1, "src", 0)
            assert agent.send_batch(key, acks) is True
            time.sleep(0.3)  # the key's retention ends; ticks go by
            assert agent.send_batch(key, acks) is True  # forgotten: applied again
            before = agent.status()["segments"][0]["in_flight"]
    finally:
        svc.stop()
    assert before == 2
    svc = TrackerService.start(GRAPH, state_dir=state, dedup_retention_ms=100)
    try:
        with Agent.connect(svc.url, GRAPH) as agent:
            assert agent.status()["segments"][0]["in_flight"] == before
    finally:
        svc.stop()


# ------------------------------------------------------------ point 8: whose state dir
def test_a_state_dir_of_another_graph_refuses_to_start(two_files: Path) -> None:
    other = SegmentGraph.of(("src", ()), ("mid", ("src",)), ("sink", ("mid",)))
    with pytest.raises(StateDirRefused, match="another pipeline graph"):
        TrackerService.start(other, state_dir=two_files)
    assert recovered_min(two_files) == 12  # untouched by the refused start


def test_another_time_grid_refuses_to_start(two_files: Path) -> None:
    with pytest.raises(StateDirRefused, match="same grid"):
        TrackerService.start(GRAPH, grid=TimeGrid(10, 2), state_dir=two_files)


def test_another_format_refuses_to_start(two_files: Path) -> None:
    path = two_files / "state.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "format": 1}))
    with pytest.raises(StateDirRefused, match="format 1"):
        TrackerService.start(GRAPH, state_dir=two_files)


def test_missing_snapshot_or_state_file_refuses_to_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run(state, 0, snapshot_every_ms=1, tick_ms=5, batches=40)
    assert (state / "snapshot.bin").exists() and not (state / "wal-00000001.log").exists()
    (state / "snapshot.bin").rename(tmp_path / "away")
    with pytest.raises(StateDirRefused, match="missing log file"):
        TrackerService.start(GRAPH, state_dir=state)
    (tmp_path / "away").rename(state / "snapshot.bin")
    (state / "state.json").unlink()
    with pytest.raises(StateDirRefused, match=r"state\.json: missing"):
        TrackerService.start(GRAPH, state_dir=state)


def test_state_dir_is_private(tmp_path: Path) -> None:
    state = tmp_path / "deploy" / "state"  # the parent too, as `serve --shards` nests them
    run(state, 0, batches=1)
    assert stat.S_IMODE(state.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for path in state.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name


# ------------------------------------------------------------ point 7: a full disk
def _refused_by_a_full_disk(state: str) -> None:
    """Child: the log file may not grow past its size (RLIMIT_FSIZE, as a full disk
    would refuse), a batch is refused; then space comes back and the server stops."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    svc = TrackerService.start(GRAPH, state_dir=Path(state))
    agent = Agent.connect(svc.url, GRAPH)
    agent.register_front(1, "src", 0, owner="test")
    _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    size = (Path(state) / "wal-00000001.log").stat().st_size
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 40, hard))
    try:
        agent.send_batch(BatchKey("q", 0, "src", 0), AckBatch.of([Ack(0, 3, 7, 1)]),
                         [Heartbeat(1, 9)], timeout_s=10)
    except Exception:  # the tracker fail-stops: INTERNAL
        pass
    else:
        os._exit(3)
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    svc.stop()
    os._exit(0)


def test_a_group_refused_by_a_full_disk_is_not_replayed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    child = multiprocessing.get_context("spawn").Process(
        target=_refused_by_a_full_disk, args=(str(state),)
    )
    child.start()
    child.join(60)
    assert child.exitcode == 0
    svc = TrackerService.start(GRAPH, state_dir=state)
    try:
        with Agent.connect(svc.url, GRAPH) as agent:
            status = agent.status()
            assert status["fronts"] == {"1": ["src", 0]}  # its heartbeat was never applied
            assert status["segments"][0]["in_flight"] == 0
            # and its key is free: the batch counts as never sent
            acks = AckBatch.of([Ack(0, 3, 7, 1)])
            assert agent.send_batch(BatchKey("q", 0, "src", 0), acks) is True
    finally:
        svc.stop()
