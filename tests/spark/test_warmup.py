"""Warming the driver's Python planner processes: in a fresh session, one read and one
write of the empty warm-up source leave a daemon for each kind of planner call, each
with a worker waiting for the query's calls (Spark reuses it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark

PLANNERS = ("create_data_source", "plan_data_source_read", "write_into_data_source",
            "commit_data_source_write")

# A fresh session (the suite's shared one has started every planner already): warm
# it, then list its JVM's Python daemons and workers as (command line, parent pid, pid).
SCRIPT = """
import json, os
from pathlib import Path
from lowtide.spark.session import SessionConfig
from lowtide.spark.warmup import WARM_SOURCE, warm_planners

spark = SessionConfig(app_name="warm", ui=False, master="local[1]").build()
warm_planners(spark)
rows = spark.read.format(WARM_SOURCE).load().count()
procs = {}  # pid: (parent pid, command line) of every process
for p in Path("/proc").iterdir():
    try:
        cmd = (p / "cmdline").read_bytes().replace(b"\\0", b" ").decode().strip()
        procs[int(p.name)] = (int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]), cmd)
    except (OSError, ValueError, IndexError):  # not a process, or it ended
        continue
mine = {os.getpid()}  # this process's descendants: its JVM, the JVM's daemons, theirs
for _ in range(3):
    mine |= {pid for pid, (ppid, _cmd) in procs.items() if ppid in mine}
procs = [[procs[pid][1], procs[pid][0], pid] for pid in mine if pid in procs
         and "pyspark.daemon" in procs[pid][1] and pid != os.getpid()]
print(json.dumps({"rows": rows, "procs": procs}))
spark.stop()
"""


def test_each_planner_daemon_has_a_worker_waiting() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["rows"] == 0
    for planner in PLANNERS:
        mine = {pid: ppid for cmd, ppid, pid in doc["procs"] if cmd.endswith(planner)}
        # the daemon, and a worker it forked that waits for the next call (kept for reuse)
        daemons = [pid for pid, ppid in mine.items() if ppid not in mine]
        assert len(daemons) == 1, f"{planner}: {doc['procs']}"
        assert [pid for pid, ppid in mine.items() if ppid == daemons[0]], planner
