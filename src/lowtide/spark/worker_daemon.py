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
"""

from __future__ import annotations

import importlib
import sys

#: what a task worker (``pyspark.worker``) of a tracked query imports, besides PySpark
TASK_MODULES = (
    "pyarrow",
    "pyarrow.compute",
    "pandas",
    "lowtide.spark.sources.generator",
    "lowtide.spark.sources.clock",
    "lowtide.spark.operators.tracked",
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


def main() -> None:
    preload(sys.argv[1] if len(sys.argv) > 1 else TASK_WORKER)
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
