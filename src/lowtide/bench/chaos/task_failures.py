"""Task failures injected into real Spark queries: untracked 1:1 ``mapInArrow``
functions that pass every row on and then fail their task, after the tracked step
before them in the same task has sent its ack batch (Spark then runs the task again,
and the acks must come out the same: rules 5 and 6). Used by the chaos bench's Spark
fault kinds and by the Spark tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def fail_once(where: Callable[[int, int], bool], marks: str | None = None
              ) -> Callable[[Any], Any]:
    """Fails the first attempt of each task for which ``where(batch_id, partition)``;
    with ``marks`` (a directory every worker sees), only the first in the whole run:
    where Spark does not retry tasks (``local[2]``) the query fails, and its restart
    runs the batch again with a first attempt."""

    def run(batches):  # type: ignore[no-untyped-def]
        from pyspark import TaskContext

        yield from batches
        tc = TaskContext.get()
        batch_id, part = int(tc.getLocalProperty("streaming.sql.batchId")), tc.partitionId()
        if tc.attemptNumber() == 0 and where(batch_id, part) and (
                marks is None or _first(os.path.join(marks, f"{batch_id}-{part}"))):
            raise RuntimeError(f"injected failure: batch {batch_id} partition {part}")

    return run


def _first(marker: str) -> bool:
    """Claim ``marker`` (False: claimed before)."""
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def fail_first_task(marker: str) -> Callable[[Any], Any]:
    """Fails the first task with rows to claim ``marker`` (a file every worker sees),
    once in the whole run, whatever the batch ids (a restart starts them again)."""

    def run(batches):  # type: ignore[no-untyped-def]
        rows = 0
        for b in batches:
            rows += b.num_rows
            yield b
        if rows and _first(marker):
            raise RuntimeError(f"injected task failure ({os.path.basename(marker)})")

    return run


__all__ = ["fail_first_task", "fail_once"]
