"""The tracker under test: ``lowtide serve`` in a subprocess on loopback, killed and
restarted on the same port and state dir, optionally with a file size limit (a disk
that fills up) or a file descriptor limit (``ulimit -n``, with a snapshot every half
second, so that snapshots meet whatever holds the descriptors). Stopped by its own pid."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from lowtide.bench.chaos.workload import GRAPH
from lowtide.wire import graph_spec


class TrackerProcess:
    def __init__(self, tmp: Path, *, shards: int = 0, secret_file: Path | None = None,
                 nofile: int | None = None, args: tuple[str, ...] = ()) -> None:
        self.state_dir = tmp / "state"
        self.graph_file = tmp / "graph.json"
        self.graph_file.write_text(json.dumps(graph_spec(GRAPH)))
        self.log_path = tmp / "tracker.log"
        self.shards, self.secret_file, self.nofile = shards, secret_file, nofile
        self.args = args
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        cmd = [sys.executable, "-m", "lowtide.service.deploy.standalone", "--port", str(self.port),
               "--graph", str(self.graph_file), "--state-dir", str(self.state_dir),
               "--log-level", "warning", "--stuck-after-ms", "60000", "--watch-stdin"]
        if self.shards:
            cmd += ["--shards", str(self.shards)]
        if self.secret_file is not None:
            cmd += ["--secret-file", str(self.secret_file)]
        if self.nofile is not None:
            cmd += ["--snapshot-every-s", "0.5"]
        return cmd + list(self.args)

    def start(self, *, file_limit_bytes: int | None = None, timeout_s: float = 30.0) -> bool:
        """Start (on the port it had, once it had one); False if it would not start
        (it said why in its log, e.g. a state dir it refuses to recover)."""
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
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline().strip() if ready else ""
        if not line.startswith("lowtide serving "):
            self.kill9()
            return False
        self.port = int(line.rsplit(":", 1)[1])
        return True

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
