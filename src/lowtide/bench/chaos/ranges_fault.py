"""The fault kind "key-range window on the driver under a sink failure and a restart"
(``lowtide bench chaos --spark``): a window with ``key_ranges=4`` (rule 15) as the
query's last step, so that Spark aggregates it and the driver emits each range's
windows (:mod:`lowtide.spark.operators.window_driver`), over four generated fronts, one
lagging, each front its own key and range. A sender task fails once (after its acks
went out); the sink's function fails once after the driver step sent a batch's acks
(the query stops, is started again from its checkpoint and runs the batch again);
later the query is stopped and started again. Ground truth: the generator's rows,
recomputed as a batch (:func:`lowtide.bench.keys.batch_windows`). "window on the
driver under a sink failure and a restart" is the same run without key ranges: the
window's results still come from the driver, every window waits for the lagging front.

* ``premature``: a window written while its range's min time was still at or below
  its end (the sink asks the tracker as it writes); a window written twice; the
  sink's min time announced while a window below it was missing or wrong (sampled
  while it runs);
* ``lost``: windows below the final min time missing or wrong at the end.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from lowtide.bench.chaos.run import Result
from lowtide.bench.chaos.speculative_fault import FAIL_BEFORE, ByBatch, drive, mismatched
from lowtide.bench.chaos.task_failures import fail_once
from lowtide.bench.keys import WINDOW, batch_windows
from lowtide.bench.spark.speculative import GRID
from lowtide.spark import Pipeline
from lowtide.spark.sources import GeneratorSpec

RANGES_DRIVER = "key-range window on the driver under a sink failure and a restart"
#: the same run without key ranges: every window waits for the lagging front
WINDOW_DRIVER = "window on the driver under a sink failure and a restart"
LAG_MS = 2_000
SPEC = GeneratorSpec(fronts=4, rate=200.0, payload_bytes=4, lag_ms={3: LAG_MS})
RESTART_AFTER_MS, RUN_MS = 4_000, 10_000  # of generated time, from t0
FAIL_SINK_AT = 6


class RangeChecked(ByBatch):
    """:class:`ByBatch` that also notes each window written while its range's min time
    (``ranged``; else the window's) was at or below its end (``pipe``: the pipeline,
    whose tracker it asks)."""

    def __init__(self, pipe: Any, fail_at: int, ranged: bool = True) -> None:
        super().__init__(fail_at)
        self.pipe = pipe
        self.ranged = ranged
        self.early: list[str] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        from lowtide.service import wall_ms

        now = wall_ms()
        rows = df.toPandas()
        done = {f: int(self.pipe.tracker.agent.min_time_at(f"win#{f}" if self.ranged
                                                           else "win", now))
                for f in rows["front"].astype(int).unique().tolist()}
        for front, end in zip(rows["front"].astype(int), rows["window_end"], strict=True):
            end_slot = GRID.slot_of(int(end.timestamp() * 1000))
            if done[front] < end_slot:
                self.early.append(f"front {front} window ending {end} written at range "
                                  f"min time {done[front]} < {end_slot}")
        super().__call__(df, batch_id)


def wrong_ranges(rows: Any, t0: int, below_ms: int) -> list[str]:
    """Windows ending at or below ``below_ms`` missing, wrong or extra in ``rows``."""
    index, cols = ["user", "end_ms"], ["n", "total"]
    expected = batch_windows(replace(SPEC, t0_ms=t0), below_ms).set_index(index)[cols]
    got = rows.rename(columns={"front": "user"}).set_index(index)[cols] if len(rows) else None
    return mismatched(expected, got, below_ms)


def ranges_run(spark: Any, tmp: Path, timeout_s: float = 300.0, key_ranges: int = 4
               ) -> Result:
    """One run of the fault kind (see the module docstring), judged; ``key_ranges=0``:
    :data:`WINDOW_DRIVER`."""
    pipe = Pipeline(spark, "chaos-ranges", stuck_after_ms=120_000)
    sink = RangeChecked(pipe, FAIL_SINK_AT, ranged=key_ranges > 0)
    marks = str(tmp / "failed")
    stream = (pipe.generate(SPEC)
              .transform(lambda d: d.mapInArrow(fail_once(FAIL_BEFORE, marks), d.schema))
              .window(WINDOW, key="front", key_ranges=key_ranges, name="win")
              .agg(n="count", total=("seq", "sum")))
    run = drive(pipe, stream, sink, str(tmp / "ckpt"), (RESTART_AFTER_MS, RUN_MS),
                timeout_s, wrong_ranges)
    return judged(sink, run.t0, run.claimed_ms, run.early, run.failures,
                  RANGES_DRIVER if key_ranges else WINDOW_DRIVER)


def judged(sink: RangeChecked, t0: int, claimed_ms: int, early: list[str],
           failures: int, name: str) -> Result:
    result = Result(name, faults=3)
    result.premature += (sink.early + early)[:3]
    rows = sink.rows()
    twice = rows[["front", "end_ms"]].duplicated() if len(rows) else []
    if len(twice) and twice.any():
        result.premature.append(f"{int(twice.sum())} windows written twice")
    result.lost = len(wrong_ranges(rows, t0, claimed_ms))
    lagging = int((rows["front"] == 3).sum()) if len(rows) else 0
    result.notes.append(f"{len(rows)} windows ({lagging} of the lagging front), "
                        f"{sink.calls - len(sink.batches)} batches written again, "
                        f"{failures} query failures restarted")
    return result


__all__ = ["RANGES_DRIVER", "WINDOW_DRIVER", "ranges_run"]
