"""The fault kinds "tracker hung under a sink" and "tracker hung under a task"
(``lowtide bench chaos --spark``): an exact window over two generated fronts, one
lagging, tracked by a standalone tracker (``lowtide serve``) that is SIGSTOPped from the
query's fourth batch on: by the sink's own function, in the first such batch with rows,
before the sink sends that batch's acks; or by a tracked filter in front of the window,
in a task, before the task sends its acks. The query must stop within ``hold_wait_s``
with one line (the sink's or the task's acks, or the window's hold, unconfirmed:
``SinkAcksFailed``, ``TaskAcksFailed`` or ``HoldFailed``); the tracker is then resumed
and the query restarted from its checkpoint, which runs the unacked batch again. Ground
truth: the generator's rows, recomputed as a batch. The first note says how the query stopped
("stopped in time", or what went wrong: still running, or an error other than
lowtide's one line).

* ``premature``: the sink's min time announced while a window below it was missing or
  wrong in the output (sampled while it runs, and at the end), or a window written
  twice;
* ``lost``: windows below the final min time missing or wrong at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowtide.bench.chaos.run import Result
from lowtide.bench.chaos.speculative_fault import (
    KEYS,
    SPEC,
    TRIGGER,
    ByBatch,
    sample,
    wrong_windows,
)
from lowtide.bench.chaos.tracker import TrackerProcess
from lowtide.bench.spark.speculative import GRID, user_columns, wait_for_t0
from lowtide.core.errors import LowtideError
from lowtide.spark import Pipeline

HUNG = "tracker hung under a sink"
HUNG_TASK = "tracker hung under a task"
WAIT_S = 3.0  # the pipeline's hold_wait_s
#: Spark's stop of a query whose tasks' retries each wait ``WAIT_S`` on the tracker
STOP_SLACK_S = 60.0
STOP_AT_CALL = 4
RUN_MS = 8_000  # of generated time, from t0
AFTER_RESTART_MS = 3_000  # of generated time (the wall clock's), after the restart


class StopsTracker(ByBatch):
    """The sink's function: keeps each batch's rows, and on its first call with rows
    from its ``at``-th on SIGSTOPs the tracker (the sink sends the batch's acks after it
    returns; a batch without rows has none to send, commits, and would leave the stop
    to whatever asks the tracker next: the window's hold)."""

    def __init__(self, pid: int, at: int) -> None:
        super().__init__()
        self.pid, self.at = pid, at
        self.stopped_at: float | None = None  # wall clock, s

    def __call__(self, df: Any, batch_id: int) -> None:
        super().__call__(df, batch_id)
        if self.calls >= self.at and self.stopped_at is None and len(self.batches[batch_id]):
            os.kill(self.pid, signal.SIGSTOP)
            self.stopped_at = time.time()


@dataclass(frozen=True)
class StopsTrackerInTask:
    """A tracked filter that keeps every row and, in the first task of batch ``at`` or
    later to run, SIGSTOPs the tracker: once over all tasks and runs, the ``marker``
    file says when (the task sends its acks after its rows)."""

    pid: int
    marker: str
    at: int

    def __call__(self, batch: Any) -> Any:
        import numpy as np
        import pyarrow as pa
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is not None and int(tc.getLocalProperty("streaming.sql.batchId")) >= self.at:
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
                os.kill(self.pid, signal.SIGSTOP)
        return pa.array(np.ones(batch.num_rows, np.bool_))

    @property
    def stopped_at(self) -> float | None:
        with contextlib.suppress(FileNotFoundError):
            return os.stat(self.marker).st_mtime
        return None


def exact_windows(rows: Any, t0: int, below_ms: int) -> list[str]:
    got = rows.set_index(["user", "end_ms"])[["n", "total"]] if len(rows) else None
    return wrong_windows(got, t0, below_ms)


def hung_sink_run(spark: Any, tmp: Path, timeout_s: float = 300.0) -> Result:
    """The tracker SIGSTOPped by the sink's function (:data:`HUNG`)."""
    return hung_run(spark, tmp, HUNG, timeout_s)


def hung_task_run(spark: Any, tmp: Path, timeout_s: float = 300.0) -> Result:
    """The tracker SIGSTOPped in a task of a step in front of the window
    (:data:`HUNG_TASK`)."""
    return hung_run(spark, tmp, HUNG_TASK, timeout_s)


def hung_run(spark: Any, tmp: Path, kind: str, timeout_s: float) -> Result:
    result = Result(kind, faults=1)
    tmp.mkdir(parents=True, exist_ok=True)
    tracker = TrackerProcess(tmp, graph=None)
    if not tracker.start():
        raise RuntimeError(f"the tracker did not start: {tracker.log_path.read_text()}")
    assert tracker.proc is not None
    pipe = Pipeline(spark, "chaos-hung", tracker=tracker.url, hold_wait_s=WAIT_S,
                    stuck_after_ms=120_000)
    in_task = kind == HUNG_TASK
    sink = ByBatch() if in_task else StopsTracker(tracker.proc.pid, STOP_AT_CALL)
    stopper: Any = (StopsTrackerInTask(tracker.proc.pid, str(tmp / "stopped"), STOP_AT_CALL)
                    if in_task else sink)
    early: list[str] = []
    stop = threading.Event()
    rows_in = user_columns(pipe.generate(SPEC), KEYS)
    if in_task:
        rows_in = rows_in.filter(stopper, name="stop")
    stream = (rows_in.window("1 second", key="user", name="win")
              .agg(n="count", total=("amount", "sum")))
    ckpt, current = str(tmp / "ckpt"), []
    try:
        current.append(stream.foreach_batch(sink, checkpoint=ckpt, trigger=TRIGGER))
        t0 = wait_for_t0(ckpt, current[-1].query, timeout_s)
        sampler = threading.Thread(target=sample, args=(current, sink, t0, early, stop,
                                                        exact_windows), daemon=True)
        sampler.start()
        result.notes.append(_stopped(current[-1], stopper, timeout_s))
        current[-1].stop()
        os.kill(tracker.proc.pid, signal.SIGCONT)
        current.append(stream.foreach_batch(sink, checkpoint=ckpt, trigger=TRIGGER))
        # past what the first run could have acked: the restart's own batches, the
        # unacked one run again first
        after_ms = max(t0 + RUN_MS, int(time.time() * 1000) + AFTER_RESTART_MS)
        current[-1].wait_for_min_time(GRID.slot_of(after_ms), "sink", timeout_s)
        stop.set()
        sampler.join()
        current[-1].stop()
        claimed_ms = current[-1].min_time("sink") * GRID.delta_ms
    finally:
        stop.set()
        with contextlib.suppress(ProcessLookupError):
            os.kill(tracker.proc.pid, signal.SIGCONT)
        pipe.close()
        tracker.kill9()
    rows = sink.rows()
    result.premature += early[:3]
    twice = int(rows[["user", "end_ms"]].duplicated().sum()) if len(rows) else 0
    if twice:
        result.premature.append(f"{twice} windows written twice")
    result.lost = len(exact_windows(rows, t0, claimed_ms))
    result.notes.append(f"{len(rows)} windows, {sink.calls - len(sink.batches)} batches "
                        "written again")
    return result


def _stopped(query: Any, stopper: Any, timeout_s: float) -> str:
    """How the query ended once the tracker hung: "stopped in time: ..." if within
    ``WAIT_S`` and the slack with lowtide's one line, else what went wrong."""
    deadline = time.monotonic() + timeout_s
    while stopper.stopped_at is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if stopper.stopped_at is None:
        return "the query never reached the batch that stops the tracker"
    with contextlib.suppress(Exception):  # Spark's own wrapping of the sink's error
        query.query.awaitTermination(WAIT_S + STOP_SLACK_S)
    took = f"{time.time() - stopper.stopped_at:.1f} s after the tracker hung"
    error = query.exception()
    if query.query.isActive:
        return f"the query still ran {took}"
    if not isinstance(error, LowtideError) or "\n" in str(error):
        return f"stopped {took}, without lowtide's one line: {str(error)[:120]!r}"
    return f"stopped in time: {took}, {type(error).__name__}"


__all__ = ["HUNG", "HUNG_TASK", "hung_sink_run", "hung_task_run"]
