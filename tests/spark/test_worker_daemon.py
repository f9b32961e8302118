"""The warm worker daemon: it imports a task worker's modules once, hands over to
PySpark's daemon (the port on stdout, the stop on stdin), and Spark's Python workers
forked from it run tracked queries with those modules already imported."""

from __future__ import annotations

import json
import os
import platform
import struct
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from lowtide.spark.session import SessionConfig
from lowtide.spark.worker_daemon import TASK_MODULES, TASK_WORKER, preload

PLANNER = "pyspark.sql.worker.create_data_source"


def _python(code: str) -> str:
    """What ``code`` prints, run in a fresh interpreter."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120).stdout


def _imported_by_preload(worker_module: str) -> dict[str, object]:
    """``preload`` in a fresh interpreter: what it returned and what is imported then."""
    code = ("import json, sys; from lowtide.spark.worker_daemon import preload; "
            f"done = preload({worker_module!r}); "
            "print(json.dumps({'done': done, 'modules': sorted(sys.modules)}))")
    return json.loads(_python(code))


def test_a_task_worker_daemon_imports_the_task_modules() -> None:
    got = _imported_by_preload(TASK_WORKER)
    assert got["done"] == [TASK_WORKER, *TASK_MODULES]
    assert set(got["done"]) <= set(got["modules"])  # type: ignore[arg-type]


def test_what_a_task_imports_to_reach_its_tracker_is_preloaded() -> None:
    """A tracked task connects to its tracker (``transport.connect``); a module it
    imports after the fork is walked by every later task's collection, unfrozen."""
    code = ("import json, sys; from lowtide.spark.worker_daemon import preload; "
            f"preload({TASK_WORKER!r}); before = set(sys.modules); "
            "from lowtide.service import Agent, BatchKey, CallerAgent; "
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    assert json.loads(_python(code)) == []


def _faults_per_round(keep: bool) -> list[int]:
    """Page faults of five rounds that allocate 12.8 MB in 64 KB arrays and free them
    (a task's buffers), in a fresh interpreter, with or without ``keep_freed_memory``."""
    code = ("import json, resource; import numpy as np; "
            "from lowtide.spark.worker_daemon import keep_freed_memory; "
            f"assert keep_freed_memory() if {keep} else True; "
            "faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt; out = []\n"
            "for _ in range(5):\n"
            "    f0 = faults(); blocks = [np.ones(8_000) for _ in range(200)]; del blocks\n"
            "    out.append(faults() - f0)\n"
            "print(json.dumps(out))")
    return json.loads(_python(code))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                    reason="mallopt is glibc's: elsewhere the daemon sets nothing")
def test_a_worker_keeps_what_a_task_freed_for_the_next_task() -> None:
    """With glibc's defaults the freed heap goes back to the kernel and every round
    faults its pages in again; a worker forked from the daemon keeps them."""
    assert min(_faults_per_round(keep=False)[1:]) > 1_000
    assert max(_faults_per_round(keep=True)[1:]) < 100


def test_a_planner_daemon_imports_only_its_module() -> None:
    got = _imported_by_preload(PLANNER)
    assert got["done"] == [PLANNER]
    assert "lowtide.spark.operators.state_processor" not in got["modules"]  # type: ignore[operator]


def test_a_module_pyspark_would_not_import_is_not_imported() -> None:
    assert preload("not_pyspark.worker") == []


def test_the_daemon_hands_over_to_pysparks_daemon() -> None:
    """Started as Spark starts it: it writes the port it listens on to stdout (PySpark's
    daemon does that once ready) and exits when Spark closes its stdin (with 1, as
    PySpark's own daemon: its ``finally`` shuts down again)."""
    env = {**os.environ, "PYTHON_WORKER_FACTORY_SECRET": "x"}
    proc = subprocess.Popen([sys.executable, "-m", "lowtide.spark.worker_daemon", TASK_WORKER],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        (port,) = struct.unpack("!i", proc.stdout.read(4))
        assert 0 < port < 65536
        proc.stdin.close()
        assert proc.wait(timeout=60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sessions_name_the_daemon_unless_told_not_to() -> None:
    """Local masters fork warm workers; a cluster's executors may not have lowtide
    installed (only the job's ``--py-files``, added after the daemon starts), so
    only ``warm_daemon=True`` names it there."""
    key, daemon = "spark.python.daemon.module", "lowtide.spark.worker_daemon"
    for master in ("local[2]", "local-cluster[2,1,1024]"):
        assert SessionConfig(master=master).settings()[key] == daemon
    for master in (None, "spark://head:7077"):
        assert key not in SessionConfig(master=master).settings()
        assert SessionConfig(master=master, warm_daemon=True).settings()[key] == daemon
    assert key not in SessionConfig(warm_daemon=False).settings()


def test_the_daemon_freezes_what_it_imported_so_per_task_collections_skip_it() -> None:
    """PySpark's daemon collects after every task of a reused worker: frozen, the
    imported modules' objects are not walked again (the module's docstring)."""
    code = ("import gc; from lowtide.spark.worker_daemon import preload, freeze_preloaded; "
            f"preload({TASK_WORKER!r}); frozen = freeze_preloaded(); "
            "print(frozen, len(gc.get_objects()))")
    frozen, walked = map(int, _python(code).split())
    assert frozen > 50_000  # pyarrow, pandas, pyspark's worker and lowtide's task modules
    assert walked < frozen // 20  # what a collection still walks


def _worker_facts(batches):  # runs in a Spark Python worker
    import gc
    import sys

    parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ")
    for b in batches:
        yield pa.record_batch({
            "parent": [parent.decode()] * b.num_rows,
            "warm": [all(m in sys.modules for m in TASK_MODULES)] * b.num_rows,
            "frozen": [gc.get_freeze_count() > 50_000] * b.num_rows})


@pytest.mark.spark
def test_the_suites_workers_are_forked_warm(spark) -> None:
    """The suite's session names the daemon (as SessionConfig does): every worker is
    forked from it with the task modules imported and frozen; every tracked query of the
    suite (tests/apps/test_demo.py: the demo's exact windows) runs on such workers."""
    assert spark.conf.get("spark.python.daemon.module") == "lowtide.spark.worker_daemon"
    facts = (spark.range(0, 8, 1, 4)
             .mapInArrow(_worker_facts, "parent string, warm boolean, frozen boolean")
             .distinct().collect())
    assert {r.parent.split()[2] for r in facts} == {"lowtide.spark.worker_daemon"}
    assert all(r.warm and r.frozen for r in facts)
