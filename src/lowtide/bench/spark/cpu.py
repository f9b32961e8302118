"""The CPU a Spark bench's process tree spends, by process and by a JVM's threads.

A run's CPU is the difference of two samples of ``/proc``, taken at two batch ends.
Processes and threads come and go between them, and a plain difference of the live
ones' totals gets that wrong both ways: a Python worker that PySpark stops after a
minute idle takes its CPU out of the end sample (what it had at the start is then
subtracted from the run), and so does a task thread the executor's pool lets go. So:

* a process's CPU includes what its reaped children spent (``cutime``/``cstime``: the
  Python daemon reaps its workers, the JVM its daemons), so a process that ends inside
  a run still counts, and what it had spent before the run is not counted twice;
* a JVM's threads are matched by thread id: a thread counts what it spent since the
  start sample (all of it if it started later); a thread that ended inside the run
  leaves its CPU in the JVM's total, under "JVM other" (it was idle for a minute
  before its pool let it go).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

#: what :func:`cpu_by_process` splits a run's CPU into
PROCESSES = ("driver", "JVM tasks", "JVM query", "JVM compiler", "JVM other",
             "Python workers")
#: a JVM's threads by the name the kernel keeps (15 characters): its tasks, its queries,
#: and its JIT compiler with the code cache's sweeper (a large share of a short run's
#: CPU, and of what a bigger plan costs per micro-batch: BENCHMARKS.md, 2026-11-28)
TASK_THREADS = ("Executor task",)
#: a streaming query's own thread ("stream execution thread for ..."): it plans every
#: micro-batch again, so a larger plan costs here, in each batch (BENCHMARKS.md,
#: 2026-11-29: most of what lowtide's window costs beyond its tasks)
QUERY_THREADS = ("stream executio",)
COMPILER_THREADS = ("C1 CompilerThre", "C2 CompilerThre", "Sweeper thread")
#: a JVM's share of each thread kind
THREAD_SHARES = {"task": "JVM tasks", "query": "JVM query", "compiler": "JVM compiler"}


def _stat(path: str) -> tuple[str, list[str]] | None:
    """A /proc ``stat`` file: the command name and the fields after it."""
    try:
        with open(path) as f:
            head, tail = f.read().rsplit(")", 1)
    except OSError:
        return None
    return head.split("(", 1)[1], tail.split()


def _cpu_s(fields: list[str], tick: int) -> float:
    """Its own CPU seconds (user + system)."""
    return (int(fields[11]) + int(fields[12])) / tick


def _reaped_s(fields: list[str], tick: int) -> float:
    """CPU seconds of its children that ended and were waited for."""
    return (int(fields[13]) + int(fields[14])) / tick


def thread_kind(name: str) -> str:
    """"task", "query", "compiler" or "other" from a JVM thread's kernel name.

    >>> thread_kind("Executor task l"), thread_kind("stream executio"), thread_kind("GC Thread#0")
    ('task', 'query', 'other')
    """
    if name.startswith(TASK_THREADS):
        return "task"
    if name.startswith(QUERY_THREADS):
        return "query"
    if name.startswith(COMPILER_THREADS):
        return "compiler"
    return "other"


@dataclass(frozen=True)
class CpuSample:
    """One moment's CPU seconds so far: per :data:`PROCESSES` share, the process
    totals (with their reaped children's, a JVM's own all under "JVM other"); per JVM
    thread, ``(pid, tid) -> (kind, seconds)`` (:func:`thread_kind`: a thread renamed
    since the start sample still has its CPU then)."""

    totals: dict[str, float]
    jvm_threads: dict[tuple[int, int], tuple[str, float]] = field(default_factory=dict)

    def total_s(self) -> float:
        return sum(self.totals.values())

    def since(self, start: CpuSample) -> dict[str, float]:
        """The CPU seconds spent between ``start`` and this sample, by share."""
        out = {k: self.totals[k] - start.totals[k] for k in PROCESSES}
        # the JVMs' own totals were put under "JVM other": move their threads' out
        for key, (kind, cpu) in self.jvm_threads.items():
            if kind not in THREAD_SHARES:
                continue
            before = start.jvm_threads.get(key, (kind, 0.0))[1]
            spent = cpu - before if cpu >= before else cpu  # less: a new thread, its id reused
            out[THREAD_SHARES[kind]] += spent
            out["JVM other"] -= spent
        return out


def cpu_by_process() -> CpuSample:
    """CPU time (user + system) of this process (the driver's Python, the embedded
    tracker) and all its descendants, by :data:`PROCESSES`: a JVM's task threads
    (``Executor task launch worker``: in local mode the tasks run in the driver's JVM),
    its streaming queries' threads (each plans its micro-batches) and its JIT compiler
    apart from its other threads (scheduling, listeners, GC), every other descendant
    as a Python worker, and every process's reaped children with the Python workers
    (this one's with the driver). A cost measure that other load on the machine does
    not inflate; ``.since(earlier)`` is a run's."""
    tick = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, str, list[str]]] = {}  # pid -> (parent, name, fields)
    for entry in os.listdir("/proc"):
        stat = _stat(f"/proc/{entry}/stat") if entry.isdigit() else None
        if stat is not None:
            procs[int(entry)] = (int(stat[1][1]), stat[0], stat[1])
    me = os.getpid()

    def mine(pid: int) -> bool:
        while pid > 1:
            if pid == me:
                return True
            pid = procs[pid][0] if pid in procs else 1
        return False

    totals = dict.fromkeys(PROCESSES, 0.0)
    threads: dict[tuple[int, int], tuple[str, float]] = {}
    for pid, (_, name, fields) in procs.items():
        own, reaped = _cpu_s(fields, tick), _reaped_s(fields, tick)
        if pid == me:
            totals["driver"] += own + reaped
        elif name == "java" and mine(pid):
            totals["JVM other"] += own  # its task and compiler threads: CpuSample.since
            totals["Python workers"] += reaped  # its children are Python daemons
            threads.update(jvm_threads(pid, tick))
        elif mine(pid):
            totals["Python workers"] += own + reaped
    return CpuSample(totals, threads)


def jvm_threads(pid: int, tick: int) -> dict[tuple[int, int], tuple[str, float]]:
    """CPU seconds and kind (:func:`thread_kind`) of a JVM's threads, by
    ``(pid, tid)``."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        stat = _stat(f"/proc/{pid}/task/{tid}/stat")
        if stat is not None:
            out[(pid, int(tid))] = (thread_kind(stat[0]), _cpu_s(stat[1], tick))
    return out


def cpu_seconds() -> float:
    """CPU time of this process and all its descendants (:func:`cpu_by_process`)."""
    return cpu_by_process().total_s()
