"""Start-up of the demos: their SparkSession, and their queries: wait until they are
warm, saying meanwhile what their first micro-batch is doing (tens of seconds on a busy
machine: Python workers and state stores start), so a user does not look at a silent
terminal."""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from lowtide.service import wall_ms

SAY_EVERY_S = 2.0
#: what a demo's driver imports once its session is up (about 0.35 s of CPU)
DRIVER_MODULES = ("lowtide.spark.pipeline", "lowtide.spark.sources.generator",
                  "lowtide.spark.operators.state_processor",
                  "lowtide.service.deploy.embedded")


def _import_all(names: tuple[str, ...]) -> None:
    for name in names:
        importlib.import_module(name)


def make_session(master: str, app: str, prewarm_workers: int = 0) -> Any:
    """The demos' session; the driver's modules are imported meanwhile (this process
    mostly waits while the JVM starts)."""
    # before the thread: two threads importing pyspark's package at once can see it
    # half initialised (a circular ImportError)
    import pyspark.sql  # noqa: F401

    from lowtide.spark import SessionConfig

    importing = threading.Thread(target=_import_all, args=(DRIVER_MODULES,),
                                 name="lowtide-imports", daemon=True)
    importing.start()
    spark = SessionConfig(master=master, app_name=app, ui=False,
                          prewarm_workers=prewarm_workers).build()
    importing.join()
    return spark


def prepare(spark: Any) -> None:
    """Register the sources; keep every progress report (drops are summed over them)."""
    # imported here: Python workers import this module (through the demos' functions
    # they run) and need none of the pipeline's driver side
    from lowtide.spark.pipeline import register_sources

    register_sources(spark)
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")


#: how Spark 4.2 says a Python worker did not start in time (its 10 s wait is fixed)
WORKER_START_FAILED = ("Python worker failed to connect back",
                       "waiting for the Python worker to connect back")


class QueryFailed(RuntimeError):
    """A demo's query failed; the message is one line that says what to do."""


class WorkerStartFailed(QueryFailed):
    """A query could not start: a Python worker did not connect back in time."""


def failure_line(name: str, error: BaseException) -> str:
    """One line for a query's failure: a Python worker that did not start in time (a
    loaded machine) says so and what to do; anything else, its first line."""
    text = str(error).strip()
    if any(marker in text for marker in WORKER_START_FAILED):
        load = os.getloadavg()[0]
        return (f"query {name} could not start: a Spark Python worker did not connect back "
                f"in time (Spark waits 10 s; load average {load:.1f} on {os.cpu_count()} "
                "cores): run it again when the machine is less busy")
    first = text.splitlines()[0] if text else type(error).__name__
    return f"query {name} failed: {first}"


def raise_if_failed(queries: list[Any]) -> None:
    for q in queries:
        error = q.exception()
        if error is not None:
            slow = any(marker in str(error) for marker in WORKER_START_FAILED)
            raise (WorkerStartFailed if slow else QueryFailed)(failure_line(q.name, error))


def phases(queries: list[Any]) -> str:
    """One line: each query's start-up phase, or "batch 0 done"."""
    from lowtide.spark.pipeline import startup_phase

    return "; ".join(f"{q.name}: {startup_phase(q) or 'batch 0 done'}" for q in queries)


def wait_warm(queries: list[Any], timeout_s: float = 300.0,
              say: Callable[[str], None] | None = None) -> int:
    """Wait until every query has done two micro-batches (Python workers started);
    returns the wall time then. ``say`` gets a start-up line every 2 s."""
    start = time.monotonic()
    next_say = start
    while any(len(q.recentProgress) < 2 for q in queries):
        raise_if_failed(queries)
        now = time.monotonic()
        if now - start > timeout_s:
            raise RuntimeError(f"queries did not start within {timeout_s:.0f} s")
        if say is not None and now >= next_say:
            say(f"starting ({now - start:.0f} s): {phases(queries)}")
            next_say = now + SAY_EVERY_S
        time.sleep(0.5)
    return wall_ms()
