"""A Spark bench's CPU per process: this process is the driver, its other descendants
count as Python workers (JVMs are split into task threads and the rest), measured on
real processes."""

from __future__ import annotations

import subprocess
import sys
import time

from lowtide.bench.spark.measure import PROCESSES, cpu_by_process, cpu_seconds

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n" \
       "time.sleep(30)"


def test_a_child_counts_as_a_worker_and_this_process_as_the_driver() -> None:
    before = cpu_by_process()
    assert set(before) == set(PROCESSES)
    child = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        t = time.process_time()
        while time.process_time() - t < 0.2:  # the driver's own share
            pass
        deadline = time.monotonic() + 60
        while cpu_by_process()["Python workers"] - before["Python workers"] < 0.35:
            assert time.monotonic() < deadline, "the busy child's CPU was not counted"
            time.sleep(0.05)
        after = cpu_by_process()
        assert after["driver"] - before["driver"] >= 0.15
        assert after["JVM tasks"] == before["JVM tasks"]  # no JVM here
        assert abs(cpu_seconds() - sum(cpu_by_process().values())) < 0.05
    finally:
        child.kill()
        child.wait()
