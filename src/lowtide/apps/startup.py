"""Start-up of the demos: their SparkSession, and their queries: wait until they are
warm, saying meanwhile what their first micro-batch is doing (tens of seconds on a busy
machine: Python workers and state stores start), so a user does not look at a silent
terminal."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lowtide.service import wall_ms
from lowtide.spark.pipeline import register_sources, startup_phase

SAY_EVERY_S = 2.0


def make_session(master: str, app: str, prewarm_workers: int = 0) -> Any:
    from lowtide.spark import SessionConfig

    return SessionConfig(master=master, app_name=app, ui=False,
                         prewarm_workers=prewarm_workers).build()


def prepare(spark: Any) -> None:
    """Register the sources; keep every progress report (drops are summed over them)."""
    register_sources(spark)
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")


def raise_if_failed(queries: list[Any]) -> None:
    for q in queries:
        if q.exception() is not None:
            raise RuntimeError(f"query {q.name} failed: {q.exception()}")


def phases(queries: list[Any]) -> str:
    """One line: each query's start-up phase, or "batch 0 done"."""
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
