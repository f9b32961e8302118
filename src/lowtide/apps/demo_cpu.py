"""CPU of the demo's processes while both queries are warm, per micro-batch: the figure
that stays comparable on a loaded machine. A micro-batch's wall time grows with what
else runs (the demo's batches took 0.67 s on an idle machine and 1.5-3 s at load 10-17),
its CPU much less: the demo spends it on each batch's fixed costs, not on its few
hundred rows, so a setting that cuts a fixed cost shows here first.

:class:`TreeCpu` samples ``/proc`` for this process's descendants (the JVM, Spark's
Python workers, planners and source runners) every ``every_s`` (a sample takes about
1.6 ms of CPU): each process counts with the most CPU it was seen with, so a process
that ends between two samples loses at most its last interval (short ones, such as
Hadoop's ``chmod`` runs, are missed).
The driver's own CPU comes from ``os.times``. Without ``/proc`` it reports nothing.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

#: process kinds, by command line, in the order they are tested
KINDS = ("driver", "jvm", "python workers", "python planners and sources", "other")


def process_kind(argv: list[str]) -> str:
    """A descendant's kind from its command line.

    >>> process_kind(["/usr/lib/jvm/java-17/bin/java", "-cp", "x"])
    'jvm'
    >>> process_kind(["python", "-m", "lowtide.spark.worker_daemon", "pyspark.worker"])
    'python workers'
    >>> process_kind(["python", "-m", "pyspark.daemon", "pyspark.sql.worker.lookup_data_sources"])
    'python planners and sources'
    """
    if argv and argv[0].endswith("java"):
        return "jvm"
    if "pyspark.worker" in argv or "lowtide.spark.worker_daemon" in argv:
        return "python workers"
    return "python planners and sources" if any("pyspark" in a for a in argv) else "other"


def _descendants(root: int) -> dict[int, tuple[str, float]]:
    """pid -> (kind, CPU seconds) of every live descendant of ``root``."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[tuple[int, float]]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        ppid, cpu = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
        children.setdefault(ppid, []).append((int(stat.parent.name), cpu))
    out: dict[int, tuple[str, float]] = {}
    todo = [root]
    while todo:
        for pid, cpu in children.get(todo.pop(), []):
            try:  # a process's command line changes when it execs (spark-submit: java)
                argv = (Path("/proc") / str(pid) / "cmdline").read_text().split("\0")
            except OSError:
                continue
            out[pid] = (process_kind(argv), cpu)
            todo.append(pid)
    return out


class TreeCpu:
    """Samples the CPU of this process and its descendants in a thread, from
    :meth:`start` to :meth:`stop`."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self.available = Path("/proc/self/stat").exists()
        self._seen: dict[int, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lowtide-demo-cpu",
                                        daemon=True)

    def start(self) -> TreeCpu:
        if self.available:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _sample(self) -> None:
        now = _descendants(os.getpid())
        with self._lock:
            for pid, (kind, cpu) in now.items():
                self._seen[pid] = (kind, max(cpu, self._seen.get(pid, (kind, 0.0))[1]))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def by_kind(self) -> dict[str, float] | None:
        """CPU seconds so far per kind (:data:`KINDS`); None without ``/proc``."""
        if not self.available:
            return None
        self._sample()
        me = os.times()
        out = dict.fromkeys(KINDS, 0.0)
        out["driver"] = me.user + me.system
        with self._lock:
            for kind, cpu in self._seen.values():
                out[kind] += cpu
        return out


def per_batch_ms(before: dict[str, float] | None, after: dict[str, float] | None,
                 batches: int) -> dict[str, float] | None:
    """CPU ms per micro-batch between two :meth:`TreeCpu.by_kind` readings, per kind
    and ``"total"``.

    >>> per_batch_ms({"jvm": 1.0, "driver": 0.5}, {"jvm": 3.0, "driver": 0.7}, 4)
    {'jvm': 500.0, 'driver': 50.0, 'total': 550.0}
    """
    if before is None or after is None or batches <= 0:
        return None
    out = {k: round(1000 * (after[k] - before.get(k, 0.0)) / batches, 1) for k in after}
    out["total"] = round(sum(out.values()), 1)
    return out
