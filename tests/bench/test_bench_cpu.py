"""A Spark bench's CPU per process: this process is the driver, its other descendants
count as Python workers (JVMs are split into task threads, compiler threads and the
rest), measured on real processes."""

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


def test_a_jvms_compiler_threads_are_counted_apart_from_its_tasks() -> None:
    """Threads named as a JVM names its JIT compiler and its tasks (the kernel's
    15-character names), here in this process: each is counted in its own share."""
    import os
    import threading

    from lowtide.bench.spark.measure import _jvm_threads_s

    def burn(name: str, ready: threading.Event, stop: threading.Event) -> None:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(name)
        ready.set()
        while not stop.is_set():
            sum(range(1000))

    tick = os.sysconf("SC_CLK_TCK")
    before = _jvm_threads_s(os.getpid(), tick)
    stop = threading.Event()
    threads = []
    for name in ("C2 CompilerThre", "Executor task l"):
        ready = threading.Event()
        threads.append(threading.Thread(target=burn, args=(name, ready, stop)))
        threads[-1].start()
        assert ready.wait(10), f"thread {name!r} did not start"
    try:
        deadline = time.monotonic() + 60
        while min(a - b for a, b in zip(_jvm_threads_s(os.getpid(), tick), before,
                                        strict=True)) < 0.1:
            assert time.monotonic() < deadline, "the named threads' CPU was not counted"
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()


def test_the_ratio_without_jit_leaves_out_only_the_compiler() -> None:
    from lowtide.bench.spark.measure import _ByProcess, without_jit_ratio

    base, side = _ByProcess(), _ByProcess()
    base.add({"JVM tasks": 1.0, "JVM compiler": 1.0}, 100)  # 100 rows per CPU s without it
    side.add({"JVM tasks": 1.0, "JVM other": 0.25, "JVM compiler": 0.0}, 100)  # 80
    assert without_jit_ratio(side, base) == 0.8
    assert without_jit_ratio(side, _ByProcess()) != without_jit_ratio(side, _ByProcess())  # nan
