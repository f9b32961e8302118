"""A Spark bench's CPU per process: this process is the driver, its other descendants
count as Python workers (JVMs are split into task threads, compiler threads and the
rest), measured on real processes; processes and threads that end inside a run."""

from __future__ import annotations

import subprocess
import sys
import time

from lowtide.bench.spark.cpu import PROCESSES, CpuSample, cpu_by_process, cpu_seconds

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n" \
       "time.sleep(30)"


def test_a_child_counts_as_a_worker_and_this_process_as_the_driver() -> None:
    before = cpu_by_process()
    assert set(before.totals) == set(PROCESSES)
    child = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        t = time.process_time()
        while time.process_time() - t < 0.2:  # the driver's own share
            pass
        deadline = time.monotonic() + 60
        while cpu_by_process().since(before)["Python workers"] < 0.35:
            assert time.monotonic() < deadline, "the busy child's CPU was not counted"
            time.sleep(0.05)
        after = cpu_by_process().since(before)
        assert after["driver"] >= 0.15
        assert after["JVM tasks"] == 0.0  # no JVM here
        assert abs(cpu_seconds() - cpu_by_process().total_s()) < 0.05
    finally:
        child.kill()
        child.wait()


def test_a_jvms_compiler_threads_are_counted_apart_from_its_tasks() -> None:
    """Threads named as a JVM names its JIT compiler and its tasks (the kernel's
    15-character names), here in this process: each is counted in its own share."""
    import os
    import threading

    from lowtide.bench.spark.cpu import jvm_threads

    def burn(name: str, ready: threading.Event, stop: threading.Event) -> None:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(name)
        ready.set()
        while not stop.is_set():
            sum(range(1000))

    tick = os.sysconf("SC_CLK_TCK")

    def by_kind() -> tuple[float, float]:
        threads = jvm_threads(os.getpid(), tick).values()
        return (sum(c for k, c in threads if k == "compiler"),
                sum(c for k, c in threads if k == "task"))

    before = by_kind()
    stop = threading.Event()
    threads = []
    for name in ("C2 CompilerThre", "Executor task l"):
        ready = threading.Event()
        threads.append(threading.Thread(target=burn, args=(name, ready, stop)))
        threads[-1].start()
        assert ready.wait(10), f"thread {name!r} did not start"
    try:
        deadline = time.monotonic() + 60
        while min(a - b for a, b in zip(by_kind(), before, strict=True)) < 0.1:
            assert time.monotonic() < deadline, "the named threads' CPU was not counted"
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()


def test_a_worker_that_ends_inside_a_run_counts_what_it_spent_in_it() -> None:
    """PySpark stops a Python worker idle for a minute: one that ends between the two
    samples of a run still counts (its parent reaped it), and what it spent before the
    run is not taken off the run's CPU."""
    burn = ("import sys, time\n"
            "def burn(s):\n t = time.process_time()\n"
            " while time.process_time() - t < s: pass\n"
            "burn(0.4); print('ready', flush=True); sys.stdin.readline(); burn(0.3)")
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        before = cpu_by_process()
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        child.wait(60)  # ended and reaped: its CPU is in this process's children's
        spent = cpu_by_process().since(before)
        assert 0.25 <= spent["Python workers"] + spent["driver"] < 1.0
    finally:
        child.kill()
        child.wait()


def test_a_jvm_thread_counts_from_the_start_sample_and_an_ended_one_stays_in_other() -> None:
    """Threads matched by id: task thread 10 ended inside the run (its 5 s before the
    run are not taken off the tasks' share), 11 ran 0.5 s more, 12 started in the run;
    the query's thread 30 ran 0.4 s; the JVM spent 3 s in all. A thread with less CPU
    than its id had is a new one."""
    start = CpuSample({**dict.fromkeys(PROCESSES, 0.0), "JVM other": 20.0},
                      {(1, 10): ("task", 5.0), (1, 11): ("task", 1.0),
                       (1, 20): ("compiler", 2.0), (1, 30): ("query", 1.0)})
    end = CpuSample({**dict.fromkeys(PROCESSES, 0.0), "JVM other": 23.0},
                    {(1, 11): ("task", 1.5), (1, 12): ("task", 0.3),
                     (1, 20): ("compiler", 2.25), (1, 30): ("query", 1.4)})
    spent = end.since(start)
    assert spent["JVM tasks"] == 0.8
    reused = CpuSample(end.totals, {**end.jvm_threads, (1, 10): ("task", 0.1)})
    assert round(reused.since(start)["JVM tasks"], 9) == 0.9  # 10's id, a new thread
    named = CpuSample(start.totals, {**start.jvm_threads, (1, 13): ("other", 4.0)})
    renamed = CpuSample(end.totals, {**end.jvm_threads, (1, 13): ("task", 4.5)})
    assert round(renamed.since(named)["JVM tasks"], 9) == 1.3  # 13 became a task thread
    assert spent["JVM compiler"] == 0.25
    assert round(spent["JVM query"], 9) == 0.4
    assert round(spent["JVM other"], 9) == 1.55  # 3 - 0.8 - 0.4 - 0.25: thread 10's last part
    assert round(sum(spent.values()), 9) == 3.0


def test_the_ratio_without_jit_leaves_out_only_the_compiler() -> None:
    from lowtide.bench.spark.measure import _ByProcess, without_jit_ratio

    base, side = _ByProcess(), _ByProcess()
    base.add({"JVM tasks": 1.0, "JVM compiler": 1.0}, 100)  # 100 rows per CPU s without it
    side.add({"JVM tasks": 1.0, "JVM other": 0.25, "JVM compiler": 0.0}, 100)  # 80
    assert without_jit_ratio(side, base) == 0.8
    assert without_jit_ratio(side, _ByProcess()) != without_jit_ratio(side, _ByProcess())  # nan
