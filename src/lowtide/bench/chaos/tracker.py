"""The tracker under test: ``lowtide serve`` in a subprocess on loopback, killed and
restarted on the same port and state dir, optionally with a file size limit (a disk
that fills up) or a file descriptor limit (``ulimit -n``, with a snapshot every half
second, so that snapshots meet whatever holds the descriptors). Or a group of two
(:class:`TrackerGroup`, ``--ha``): a leader and a standby sharing a step log in Kafka.
Stopped by their own pids."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from lowtide.bench.chaos.workload import GRAPH
from lowtide.core.graph import SegmentGraph
from lowtide.wire import graph_spec


class TrackerProcess:
    def __init__(self, tmp: Path, *, shards: int = 0, secret_file: Path | None = None,
                 nofile: int | None = None, args: tuple[str, ...] = (),
                 ha: str | None = None, port: int = 0, log_path: Path | None = None,
                 graph: SegmentGraph | None = GRAPH) -> None:
        self.state_dir = tmp / "state"
        # None: the graph of the first pipeline that connects (a Spark scenario's)
        self.graph_file = tmp / "graph.json" if graph is not None else None
        if self.graph_file is not None:
            self.graph_file.write_text(json.dumps(graph_spec(graph)))
        self.log_path = log_path or tmp / "tracker.log"
        self.ha = ha  # kafka://HOST:PORT/GROUP: a member of a group, no state dir
        self.shards, self.secret_file, self.nofile = shards, secret_file, nofile
        self.args = args
        self.port = port
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        cmd = [sys.executable, "-m", "lowtide.service.deploy.standalone", "--port", str(self.port),
               "--log-level", "warning", "--stuck-after-ms", "60000", "--watch-stdin"]
        if self.graph_file is not None:
            cmd += ["--graph", str(self.graph_file)]
        cmd += (["--ha", self.ha, "--lease-s", str(LEASE_S)] if self.ha
                else ["--state-dir", str(self.state_dir)])
        if self.shards:
            cmd += ["--shards", str(self.shards)]
        if self.secret_file is not None:
            cmd += ["--secret-file", str(self.secret_file)]
        if self.nofile is not None:
            cmd += ["--snapshot-every-s", "0.5"]
        return cmd + list(self.args)

    def start(self, *, file_limit_bytes: int | None = None, timeout_s: float = 30.0,
              standby: bool = False) -> bool:
        """Start (on the port it had, once it had one); False if it would not start
        (it said why in its log, e.g. a state dir it refuses to recover). A group's
        member (``ha``) leads before this returns, or with ``standby`` stands by."""
        def limit() -> None:  # in the child: writes past the limit fail with EFBIG
            if file_limit_bytes is not None:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit_bytes, file_limit_bytes))
            if self.nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(self._command(), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, text=True,
                                         preexec_fn=limit)
        line = self.read_line(timeout_s)
        if self.ha and line.startswith("lowtide standby "):
            if standby:
                return True
            line = self.read_line(timeout_s)
        if not line.startswith("lowtide serving "):
            self.kill9()
            return False
        self.port = int(line.rsplit(":", 1)[1])
        return True

    def read_line(self, timeout_s: float) -> str:
        """The next line it prints ("" if none in time)."""
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        return self.proc.stdout.readline().strip() if ready else ""

    def kill9(self) -> None:
        """SIGKILL the tracker (its shards exit by themselves: they watch its stdin)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        self.proc = None
        time.sleep(0.2 if not self.shards else 1.0)  # shards see the closed pipe and go

    def wal_files(self) -> list[Path]:
        return sorted(p for p in self.state_dir.rglob("*") if p.is_file() and "wal" in p.name)


#: a leader silent this long is taken over (a group's --lease-s)
LEASE_S = 2.0


class TrackerGroup:
    """Two ``lowtide serve --ha`` on fixed ports sharing a step log in ``bootstrap``'s
    Kafka; clients get both addresses. One log file for both (appended to)."""

    def __init__(self, tmp: Path, bootstrap: str, *, secret_file: Path | None = None,
                 args: tuple[str, ...] = ()) -> None:
        ha = f"kafka://{bootstrap}/chaos-{uuid.uuid4().hex[:8]}"
        self.log_path = tmp / "tracker.log"
        self.members = []
        for k in range(2):
            (tmp / f"member-{k}").mkdir(exist_ok=True)
            self.members.append(TrackerProcess(
                tmp / f"member-{k}", secret_file=secret_file, args=args, ha=ha,
                port=free_port(), log_path=self.log_path))
        self.leader = 0

    @property
    def url(self) -> str:
        return ",".join(member.url for member in self.members)

    def start(self) -> bool:
        """The first member leads (the log is new and silent), the second stands by."""
        return self.members[0].start() and self.members[1].start(standby=True)

    def take_over(self, since: float, timeout_s: float = 30.0) -> float | None:
        """Seconds from ``since`` (monotonic) until the standby serves (None: not in
        ``timeout_s``); it leads now."""
        standby = self.members[1 - self.leader]
        if not standby.read_line(timeout_s).startswith("lowtide serving "):
            return None
        self.leader = 1 - self.leader
        return time.monotonic() - since

    def kill9(self) -> None:
        for member in self.members:
            member.kill9()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
