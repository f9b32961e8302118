"""The fault kind "tracker hung under a sink" (``lowtide bench chaos --spark``): an exact
window over two generated fronts, one lagging, tracked by a standalone tracker
(``lowtide serve``) that the sink's own function SIGSTOPs in its fourth batch, before
the sink sends that batch's acks. The query must stop within ``hold_wait_s`` with one
line (the sink's acks, or the window's hold, unconfirmed: ``SinkAcksFailed`` or
``HoldFailed``); the tracker is then resumed and the query restarted from its
checkpoint, which runs the unacked batch again. Ground truth: the generator's rows,
recomputed as a batch. The first note says how the query stopped ("stopped in time",
or what went wrong: still running, or an error other than lowtide's one line).

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
WAIT_S = 3.0  # the pipeline's hold_wait_s
#: Spark's stop of a query whose tasks wait on the tracker (their own 30 s)
STOP_SLACK_S = 60.0
STOP_AT_CALL = 4
RUN_MS = 8_000  # of generated time, from t0
AFTER_RESTART_MS = 3_000  # of generated time (the wall clock's), after the restart


class StopsTracker(ByBatch):
    """The sink's function: keeps each batch's rows, and on its ``at``-th call SIGSTOPs
    the tracker (the sink sends the batch's acks after it returns)."""

    def __init__(self, pid: int, at: int) -> None:
        super().__init__()
        self.pid, self.at = pid, at
        self.stopped_at: float | None = None

    def __call__(self, df: Any, batch_id: int) -> None:
        super().__call__(df, batch_id)
        if self.calls == self.at:
            os.kill(self.pid, signal.SIGSTOP)
            self.stopped_at = time.monotonic()


def exact_windows(rows: Any, t0: int, below_ms: int) -> list[str]:
    got = rows.set_index(["user", "end_ms"])[["n", "total"]] if len(rows) else None
    return wrong_windows(got, t0, below_ms)


def hung_sink_run(spark: Any, tmp: Path, timeout_s: float = 300.0) -> Result:
    result = Result(HUNG, faults=1)
    tmp.mkdir(parents=True, exist_ok=True)
    tracker = TrackerProcess(tmp, graph=None)
    if not tracker.start():
        raise RuntimeError(f"the tracker did not start: {tracker.log_path.read_text()}")
    assert tracker.proc is not None
    pipe = Pipeline(spark, "chaos-hung-sink", tracker=tracker.url, hold_wait_s=WAIT_S,
                    stuck_after_ms=120_000)
    sink, early, stop = StopsTracker(tracker.proc.pid, STOP_AT_CALL), [], threading.Event()
    stream = (user_columns(pipe.generate(SPEC), KEYS)
              .window("1 second", key="user", name="win").agg(n="count", total=("amount", "sum")))
    ckpt, current = str(tmp / "ckpt"), []
    try:
        current.append(stream.foreach_batch(sink, checkpoint=ckpt, trigger=TRIGGER))
        t0 = wait_for_t0(ckpt, current[-1].query, timeout_s)
        sampler = threading.Thread(target=sample, args=(current, sink, t0, early, stop,
                                                        exact_windows), daemon=True)
        sampler.start()
        result.notes.append(_stopped(current[-1], sink, timeout_s))
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


def _stopped(query: Any, sink: StopsTracker, timeout_s: float) -> str:
    """How the query ended once the tracker hung: "stopped in time: ..." if within
    ``WAIT_S`` and the slack with lowtide's one line, else what went wrong."""
    deadline = time.monotonic() + timeout_s
    while sink.stopped_at is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if sink.stopped_at is None:
        return "the query never reached the batch that stops the tracker"
    with contextlib.suppress(Exception):  # Spark's own wrapping of the sink's error
        query.query.awaitTermination(WAIT_S + STOP_SLACK_S)
    took = f"{time.monotonic() - sink.stopped_at:.1f} s after the tracker hung"
    error = query.exception()
    if query.query.isActive:
        return f"the query still ran {took}"
    if not isinstance(error, LowtideError) or "\n" in str(error):
        return f"stopped {took}, without lowtide's one line: {str(error)[:120]!r}"
    return f"stopped in time: {took}, {type(error).__name__}"


__all__ = ["HUNG", "hung_sink_run"]
