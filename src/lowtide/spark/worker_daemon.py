"""PySpark's Python worker daemon, started warm.

Spark starts Python workers through a daemon per worker module (``python -m
pyspark.daemon pyspark.worker``, and one for each driver-side planner module); the
daemon forks a worker for each connection, and each new worker imports what its task
needs: pyarrow, pandas and lowtide's task modules, about 0.7 s of CPU per worker on the
2-core machine. ``SessionConfig`` names this module as ``spark.python.daemon.module``:
it imports the worker module and, for task workers, those modules once, then hands
over to PySpark's own daemon, so every worker it forks starts with them imported.
(Spark 4.2 starts only the task workers' daemon with this module; its driver-side
planner daemons stay ``pyspark.daemon`` whatever the setting says.)

PySpark imports the worker module only after the fork, in case an import starts a
thread: numpy's OpenBLAS and pyarrow's jemalloc each start one. Both register fork
handlers (``pthread_atfork``), so their forked children work; the tests run tracked
queries on workers forked from this daemon.

Then it freezes what it imported (``gc.freeze``: Python's collector skips those objects
from then on). PySpark's daemon runs a full ``gc.collect()`` in a reused worker after
every task, and a full collection walks every object the process has: about 85,000
once pyarrow, pandas and lowtide are imported, 26 ms of CPU per task on the 2-core
machine, most of what a Python task of ``lowtide bench spark`` cost. Frozen, a worker
walks only what it made itself (about 8,000 objects, 2 ms), and its collections no
longer write to the shared pages (each object's header), which copy-on-write would
copy into every worker.

It also has glibc's allocator keep freed memory for the next task
(:func:`keep_freed_memory`): a worker's tasks free and allocate the same buffers, and
each page given back faulted in again.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import platform
import sys

#: what a task worker (``pyspark.worker``) of a tracked query imports, besides PySpark
TASK_MODULES = (
    "pyarrow",
    "pyarrow.compute",
    "pandas",
    "lowtide.spark.tracking.kernels",  # compiled once here, not in every worker
    "lowtide.spark.sources.generator",
    "lowtide.spark.sources.clock",
    "lowtide.spark.operators.tracked",
    # the tracker's client (asyncio with it): imported after the fork, its ~5,000
    # objects were walked by every task's collection (4.0 ms a task, 1.9 without)
    "lowtide.service.client.agent",
    "lowtide.service.client.caller",
    "lowtide.service.client.batches",
    "lowtide.spark.operators.state_processor",
    "pyarrow.parquet",  # write_parquet's tasks
    "lowtide.spark.sinks.parquet",
)
TASK_WORKER = "pyspark.worker"


def preload(worker_module: str) -> list[str]:
    """Import ``worker_module`` (as PySpark's daemon names it: only a ``pyspark``
    module) and, for task workers, :data:`TASK_MODULES`; returns the modules imported.
    One that fails to import is skipped: the worker imports it again and reports."""
    wanted = [worker_module] if worker_module.startswith("pyspark") else []
    if worker_module == TASK_WORKER:
        wanted += TASK_MODULES
    done = []
    for name in wanted:
        try:
            importlib.import_module(name)
        except Exception:  # the daemon must start: the worker imports it again and reports
            continue
        done.append(name)
    return done


def freeze_preloaded() -> int:
    """Collect the imports' garbage, then freeze every object alive (see the module's
    docstring); returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


#: glibc's ``mallopt`` parameters (``malloc.h``) and what a worker sets them to
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEPT_HEAP_BYTES = 64 << 20
HEAP_UP_TO_BYTES = 32 << 20


def keep_freed_memory() -> bool:
    """Have glibc's allocator keep what a task frees for the next one: blocks up to
    :data:`HEAP_UP_TO_BYTES` come from the heap (not a mapping of their own, unmapped
    when freed), and the heap keeps up to :data:`KEPT_HEAP_BYTES` free at its top. A
    Python worker allocates and frees the same buffers task after task (the Arrow
    messages read from Spark, numpy arrays); with glibc's defaults their pages went
    back to the kernel and came back as page faults, about 4,700 a micro-batch of
    ``lowtide bench spark`` (14 ms of the workers' CPU in 43), none with these. The
    cost: a worker may hold up to that much free heap besides what it uses. False
    where the C library is not glibc (nothing is set)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, HEAP_UP_TO_BYTES)
                and mallopt(M_TRIM_THRESHOLD, KEPT_HEAP_BYTES))


def main() -> None:
    keep_freed_memory()  # before the imports: the workers inherit the setting
    preload(sys.argv[1] if len(sys.argv) > 1 else TASK_WORKER)
    from pyspark.daemon import manager

    freeze_preloaded()
    manager()


if __name__ == "__main__":
    main()
