"""Helpers for tests that run servers and agents as separate processes.

Every process started here is stopped by its own pid in a ``finally``.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.core.acks import child_acks, root_acks
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import AckBatch, Heartbeat, MinTimeUpdate
from lowtide.service import Agent, BatchKey
from lowtide.service.client.base_agent import close_shared

GRAPH_SPEC = [["src", []], ["sink", ["src"]]]
ITEMS_PER_SLOT = 40


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    url: str
    lines: list[str]
    log_path: Path

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_serving(self, timeout_s: float) -> str:
        """A standby's ``lowtide serving`` line, once it leads (``--ha``)."""
        line = read_line(self.proc, timeout_s)
        if not line.startswith("lowtide serving "):
            raise RuntimeError(f"unexpected output {line!r}: {self.log()}")
        self.lines.append(line)
        return line.split()[-1]


def write_graph(tmp: Path) -> Path:
    path = tmp / "graph.json"
    path.write_text(json.dumps(GRAPH_SPEC))
    return path


@contextmanager
def serve(
    tmp: Path, *args: str, env: dict[str, str] | None = None, nofile: int | None = None,
    standby: bool = False,
) -> Iterator[ServerProcess]:
    """``lowtide serve`` in a subprocess; yields once it prints its URL(s) (``standby``:
    once it stands by, ``--ha``; its URL is then its ``--port``'s). ``nofile``: its
    file limit, as ``ulimit -n`` would set it (soft and hard)."""

    def limit() -> None:  # in the child, before it runs the server
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    log_path = tmp / f"serve-{time.monotonic_ns()}.log"
    cmd = [sys.executable, "-m", "lowtide.cli", "serve", "--log-format", "json", *args]
    if "--port" not in args:
        cmd += ["--port", "0"]
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
            env={**os.environ, **(env or {})},
            preexec_fn=limit,
        )
    lines: list[str] = []
    url = ""
    try:
        lines.append(read_line(proc, 30))
        expected = "lowtide standby " if standby else "lowtide serving "
        if not lines[0].startswith(expected):
            raise RuntimeError(f"unexpected output {lines[0]!r}: {log_path.read_text()}")
        url = (f"tcp://127.0.0.1:{args[args.index('--port') + 1]}" if standby
               else lines[0].split()[-1])
        yield ServerProcess(proc, url, lines, log_path)
    finally:
        if url:
            close_shared(url)  # this process's agents for it: no one dials its dead port
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()


def read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if not ready:
        raise TimeoutError("the server printed nothing")
    line = proc.stdout.readline().strip()
    if not line:
        raise RuntimeError(f"the server exited with {proc.wait(5)}")
    return line


def values(front: int, slot: int) -> np.ndarray:
    seq = np.arange(slot * 1000, slot * 1000 + ITEMS_PER_SLOT, dtype=np.uint64)
    return root_acks(front, seq)


def produced(front: int, slot: int) -> AckBatch:
    """Send-acks of a front's items of ``slot`` into ``src``."""
    return AckBatch.from_columns(0, np.full(ITEMS_PER_SLOT, slot), values(front, slot), 1)


def consumed(front: int, slot: int) -> tuple[AckBatch, AckBatch]:
    """(receive from src + send of the child into sink, receive of the child)."""
    v = values(front, slot)
    child = child_acks(v, operator=1, child_index=np.zeros(len(v), np.uint64))
    times = np.full(len(v), slot)
    first = AckBatch.concat(
        [AckBatch.from_columns(1, times, child, 1), AckBatch.from_columns(0, times, v, -1)]
    )
    return first, AckBatch.from_columns(1, times, child, -1)


# ------------------------------------------------------------ agent processes
def graph() -> SegmentGraph:
    return SegmentGraph.of(*((n, tuple(u)) for n, u in GRAPH_SPEC))


#: the owner name the watcher registers the fronts with, proven by their producers
FRONT_OWNER = "producers"


def producer(url: str, front: int, slots: int) -> None:
    """A front: each slot's items under a Spark-like key, heartbeat with them (proving
    the owner the fronts were registered with, as a Spark source's tasks do)."""
    with Agent.connect(url, graph()) as agent:
        for slot in range(1, slots + 1):
            key = BatchKey("q", slot, "src", front)
            agent.send_batch(key, produced(front, slot), [Heartbeat(front, slot + 1)],
                             owner=FRONT_OWNER)
            time.sleep(0.03)


def consumer(
    url: str, fronts: tuple[int, ...], slots: int, held: tuple[int, int], holding: Any, release: Any
) -> None:
    """Receives every front's items; the ``held`` (front, slot) waits for ``release``."""
    with Agent.connect(url, graph()) as agent:
        for slot in range(1, slots + 1):
            for front in fronts:
                first, second = consumed(front, slot)
                agent.send_batch(BatchKey("q", slot, "sink", front), first)
                if (front, slot) == held:
                    holding.set()
                    release.wait(60)
                agent.send_batch(BatchKey("q", slot, "out", front), second)
            time.sleep(0.03)


def stop_processes(procs: list[Any]) -> None:
    """Kill what still runs (by its own pid) and reap every process."""
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)


def finish_held(url: str, procs: list[Any], holding: Any, release: Any, held: int,
                slots: int, seen: list[MinTimeUpdate]) -> dict[str, Any]:
    """After an outage (a restart, a takeover) while the consumer holds front 0's slot
    ``held``: the producers finish, a new subscriber starts between what ``seen`` had
    before and ``held`` (nothing lost, nothing premature, for ``seen`` too), the
    release completes everything, ``seen`` never went back, and a retry of a batch
    confirmed before is not applied again. Returns the tracker's final status."""
    before = seen[-1].time
    assert holding.wait(60)
    for p in procs[:2]:
        p.join(60)
        assert p.exitcode == 0
    with Agent.connect(url, graph()) as late, late.subscribe("sink") as sub:
        current = sub.next_update(20).time
        assert before <= current <= held
        assert max(u.time for u in seen) <= held
        release.set()
        assert sub.wait_for(slots + 1, timeout_s=30).time == slots + 1
        procs[2].join(30)
        assert procs[2].exitcode == 0
        key = BatchKey("q", 1, "src", 0)
        assert late.send_batch(key, produced(0, 1), [Heartbeat(0, 2)]) is False
        status: dict[str, Any] = late.status()
    assert [u.time for u in seen] == sorted({u.time for u in seen})
    assert status["global_min"] == slots + 1
    assert all(s["open_windows"] == 0 and s["in_flight"] == 0 for s in status["segments"])
    return status


def wait_until(check: Any, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError("condition not met")


def shard_pids(agent: Agent) -> list[int]:
    def pids() -> list[int] | None:
        shards = agent.status()["shards"]
        if all(s["status"] for s in shards):
            return [s["status"]["pid"] for s in shards]
        return None

    return wait_until(pids)
