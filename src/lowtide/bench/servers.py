"""Tracker servers for benches: ``lowtide serve`` in a subprocess on loopback, stopped
by its own pid, and the CPU its processes spent."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lowtide.service import Agent


@contextmanager
def serve_subprocess(args: list[str], timeout_s: float = 60.0) -> Iterator[str]:
    """``lowtide serve <args>`` on loopback in a subprocess; yields its url once it
    says it serves, and stops it (and so its shards) by its pid."""
    cmd = [sys.executable, "-m", "lowtide.service.deploy.standalone", "--port", "0", *args]
    # --watch-stdin: the server exits when this process dies, even by SIGKILL
    cmd += ["--log-level", "warning", "--stuck-after-ms", "60000", "--watch-stdin"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline().strip() if ready else ""
        if not line.startswith("lowtide serving "):
            raise RuntimeError(f"server did not start within {timeout_s:.0f} s: {line!r}")
        yield line.split()[-1]
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def server_pids(agent: Agent) -> dict[str, int]:
    """The server's pid, and its shards' once the coordinator has polled them."""
    deadline = time.monotonic() + 10
    while True:
        status = agent.status()
        shards = status.get("shards", [])
        if all(s["status"] for s in shards) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    pids = {"server": int(status["pid"])}
    pids.update({f"shard {k}": s["status"]["pid"] for k, s in enumerate(shards) if s["status"]})
    return pids


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
