"""The demo's CPU per micro-batch (``cpu_ms_per_batch``) counts its descendants' CPU:
a real child process that burns CPU is seen, by kind, and a process that ended keeps
what it was last seen with."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from lowtide.apps.demo_cpu import KINDS, TreeCpu, per_batch_ms

BURN = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_child_that_burns_cpu_is_counted_and_kept_after_it_ends() -> None:
    cpu = TreeCpu(every_s=0.05).start()
    try:
        before = cpu.by_kind()
        assert before is not None and set(before) == set(KINDS)
        child = subprocess.Popen([sys.executable, "-c", BURN.format(s=0.6)])
        while child.poll() is None:
            time.sleep(0.05)
        after = cpu.by_kind()
    finally:
        cpu.stop()
    assert after is not None
    # a Python process that is no Spark part: "other"; the last sample before it
    # ended misses at most one interval of it
    assert 0.6 - 0.2 <= after["other"] - before["other"] <= 0.6 + 0.3
    assert after["driver"] >= before["driver"]


def test_per_batch_needs_batches_and_readings() -> None:
    assert per_batch_ms(None, {"jvm": 1.0}, 3) is None
    assert per_batch_ms({"jvm": 1.0}, {"jvm": 2.0}, 0) is None
    assert per_batch_ms({"jvm": 1.0}, {"jvm": 2.5}, 3) == {"jvm": 500.0, "total": 500.0}
