"""The fault kind "speculative window under task failures and a restart" (``lowtide
bench chaos --spark``): a speculative window (rule 13, on Spark's aggregation: the plan
a checkpointed query gets) over two generated fronts, one lagging; tasks fail once
before the window (a sender's, after its acks went out) and after its changelog step
(after the changelog's acks went out), and the query is stopped and restarted from its
checkpoint once windows are final. Ground truth: the generator's rows, recomputed as a
batch (:func:`lowtide.bench.spark.speculative.batch_windows`).

The fault kind "speculative window on the driver under a sink failure and a restart":
the same window as the query's last step, so that its changelog step runs on the driver
in the sink's ``foreachBatch`` (:mod:`lowtide.spark.operators.speculative_driver`); the
sender task fails once as above, the sink's function fails once after the step sent a
batch's acks (the query stops; it is started again from its checkpoint and runs the
batch again), then the stop and restart above.

* ``premature``: the sink's min time announced while a window below it had no final
  row, or a final other than the batch's (sampled while it runs, and at the end); a
  version written twice; a row for a window after its final (a final cancelled);
* ``lost``: windows below the final min time whose final is missing or wrong at the
  end; the changelog folded (``apply_changelog``) must equal the finals.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lowtide.bench.chaos.run import Result
from lowtide.bench.chaos.task_failures import fail_once
from lowtide.bench.spark.speculative import GRID, batch_windows, user_columns, wait_for_t0
from lowtide.spark import Pipeline
from lowtide.spark.pipeline import QueryFailed
from lowtide.spark.sinks import apply_changelog, finals
from lowtide.spark.sources import GeneratorSpec

SPECULATIVE = "speculative window under task failures and a restart"
SPECULATIVE_DRIVER = "speculative window on the driver under a sink failure and a restart"
SPEC = GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4, lag_ms={1: 1000})
KEYS = 4
TRIGGER = "300 milliseconds"
RESTART_AFTER_MS, RUN_MS = 3_000, 8_000  # of generated time, from t0
#: (batch id, partition) -> fail that task's first attempt: before the window, after it
FAIL_BEFORE, FAIL_AFTER = (lambda b, p: b % 5 == 3 and p == 0), (lambda b, p: b % 4 == 2)
FAIL_SINK_AT = 6  # the sink fails once, in the first batch from this one that has rows
#: where Spark retries no task, each injected task failure stops the query once (at
#: most about 25 in a run's 30-odd batches, with the sink's); more restarts than that
#: mean a failure of the query's own, which is raised, not restarted for ever
MAX_FAILURES = 40


class ByBatch:
    """A ``foreach_batch`` function keeping each batch id's rows (a batch run again
    replaces them, as an idempotent sink would); ``fail_at``: it raises once, after
    keeping the rows of the first batch from that one with rows."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.batches: dict[int, Any] = {}
        self.calls = 0
        self.fail_at = fail_at
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.toPandas()
        with self._lock:
            self.batches[batch_id] = rows
            self.calls += 1
        if self.fail_at is not None and batch_id >= self.fail_at and len(rows):
            self.fail_at = None
            raise RuntimeError("chaos: the sink failed once")

    def rows(self) -> Any:
        """Every row in batch order, with its window's end in ms (``end_ms``)."""
        import pandas as pd

        with self._lock:
            frames = [self.batches[b].assign(batch=b) for b in sorted(self.batches)]
        rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        if len(rows):
            end = pd.to_datetime(rows["window_end"], utc=True)
            rows["end_ms"] = (end - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)
        return rows


@dataclass
class SpeculativeRun:
    rows: Any = None
    t0: int = 0
    claimed_ms: int = 0  # the sink's min time at the end, in ms
    early: list[str] = field(default_factory=list)  # premature announcements seen
    reruns: int = 0  # batches whose function ran more than once
    failures: int = 0  # query failures (each started again from the checkpoint)


def speculative_run(spark: Any, tmp: Path, timeout_s: float = 300.0,
                    on_driver: bool = False) -> SpeculativeRun:
    """One run of the fault kind; ``on_driver``: the driver step's (see the module
    docstring)."""
    pipe = Pipeline(spark, "chaos-speculative", stuck_after_ms=120_000)
    sink = ByBatch(FAIL_SINK_AT if on_driver else None)
    marks = str(tmp / "failed")  # each injected task failure happens once in the run
    stream = (user_columns(pipe.generate(SPEC), KEYS)
              .transform(lambda d: d.mapInArrow(fail_once(FAIL_BEFORE, marks), d.schema))
              .window("1 second", key="user", name="win").agg(n="count", total=("amount", "sum"))
              .speculative())
    if not on_driver:
        stream = stream.transform(lambda d: d.mapInArrow(fail_once(FAIL_AFTER, marks),
                                                         d.schema))
    run = drive(pipe, stream, sink, str(tmp / "ckpt"), (RESTART_AFTER_MS, RUN_MS), timeout_s)
    run.rows, run.reruns = sink.rows(), sink.calls - len(sink.batches)
    return run


def drive(pipe: Any, stream: Any, sink: ByBatch, ckpt: str, at_ms: tuple[int, int],
          timeout_s: float, wrong: Callable[[Any, int, int], list[str]] | None = None
          ) -> SpeculativeRun:
    """Write ``stream`` into ``sink`` (``foreach_batch`` from ``ckpt``) and close
    ``pipe``: stopped and started again once the sink is ``at_ms[0]`` past t0, run to
    ``at_ms[1]`` past t0 and on until the sink's failure has come; a query that fails
    (a task's failure where Spark retries no task, as ``local[2]``; the sink's) is
    started again from its checkpoint, a bounded number of times. A sampler notes the
    sink's min time announced over windows ``wrong`` finds (default
    :func:`wrong_finals`) missing or wrong."""
    run, current = SpeculativeRun(), []

    def start() -> Any:
        current.append(stream.foreach_batch(sink, checkpoint=ckpt, trigger=TRIGGER))
        return current[-1]

    def run_to(ms: int) -> None:
        while True:
            try:
                current[-1].wait_for_min_time(GRID.slot_of(ms), "sink", timeout_s)
                return
            except QueryFailed:
                run.failures += 1
                if run.failures > MAX_FAILURES:
                    raise
                start()

    stop = threading.Event()
    try:
        run.t0 = wait_for_t0(ckpt, start().query, timeout_s)
        sampler = threading.Thread(target=sample, args=(
            current, sink, run.t0, run.early, stop, wrong or wrong_finals), daemon=True)
        sampler.start()
        run_to(run.t0 + at_ms[0])
        current[-1].stop()
        start()
        run_to(run.t0 + at_ms[1])
        while sink.fail_at is not None:  # the sink's failure is yet to come: run on
            run_to(current[-1].min_time("sink") * GRID.delta_ms + 1000)
        stop.set()
        sampler.join()
        current[-1].stop()
        run.claimed_ms = current[-1].min_time("sink") * GRID.delta_ms
    finally:
        stop.set()
        pipe.close()
    return run


def wrong_windows(got: Any, t0: int, below_ms: int) -> list[str]:
    """Windows ending at or below ``below_ms`` whose row in ``got`` ((user, end_ms) ->
    n, total; None: no rows) is missing or is not the batch recomputation's, and rows
    of windows the batch has not."""
    return mismatched(batch_windows(t0, below_ms, KEYS, SPEC), got, below_ms)


def mismatched(expected: Any, got: Any, below_ms: int) -> list[str]:
    """The windows ending at or below ``below_ms`` whose row in ``got`` is missing or
    differs from ``expected``'s (each (user, end_ms) -> n, total; ``got`` None: no
    rows), and rows of ``got`` that ``expected`` has not."""
    expected = expected[expected.index.get_level_values("end_ms") <= below_ms]
    got = expected.iloc[:0] if got is None else got
    both = expected.join(got, rsuffix="_out", how="left")
    bad = both[(both["n"] != both["n_out"]) | (both["total"] != both["total_out"])]
    ends = got.index.get_level_values("end_ms")
    extra = got[(ends <= below_ms) & ~got.index.isin(expected.index)]
    return [f"{user} window ending {end}" for user, end in [*bad.index, *extra.index]]


def wrong_finals(rows: Any, t0: int, below_ms: int) -> list[str]:
    """:func:`wrong_windows` of a changelog's final rows."""
    return wrong_windows(finals(rows.drop(columns=["batch"])).set_index(["user", "end_ms"])[
        ["n", "total"]] if len(rows) else None, t0, below_ms)


def sample(current: list[Any], sink: ByBatch, t0: int, early: list[str],
           stop: threading.Event, wrong: Callable[[Any, int, int], list[str]] = wrong_finals
           ) -> None:
    """Every 0.3 s: the sink's min time, then the output then: a window below it that
    ``wrong`` finds missing or wrong (the output's rows, ``t0``, the min time in ms) is
    premature, noted in ``early``."""
    while not stop.wait(0.3):
        try:
            claimed_ms = current[-1].min_time("sink") * GRID.delta_ms
            rows = sink.rows()
        except Exception:  # the query stopping under it
            continue
        bad = wrong(rows, t0, claimed_ms)
        if bad:
            early.append(f"min time {claimed_ms} ms: {len(bad)} windows below it "
                         f"missing or wrong ({bad[0]})")


def result_of(run: SpeculativeRun, name: str = SPECULATIVE) -> Result:
    result = Result(name, faults=3)
    result.premature += run.early[:3]
    rows = run.rows
    ident = rows[["user", "end_ms", "version", "op"]]
    if ident.duplicated().any():
        result.premature.append(f"{int(ident.duplicated().sum())} versions written twice")
    # rows are in batch order: a final must be its window's last row
    final = rows["is_final"].astype(bool)
    last = rows.index.isin(rows.groupby(["user", "end_ms"]).tail(1).index)
    after = int((final & ~last).sum())
    if after:
        result.premature.append(f"{after} windows changed after their final")
    wrong = wrong_finals(rows, run.t0, run.claimed_ms)
    result.lost = len(wrong)
    folded = apply_changelog(rows.drop(columns=["batch"]))
    folded = folded[folded["end_ms"] <= run.claimed_ms]
    if not folded["is_final"].astype(bool).all():
        result.premature.append("the changelog folds to a non-final row below the min time")
    result.notes.append(f"{int(final.sum())} finals, {int((rows['op'] == 'tombstone').sum())}"
                        f" tombstones, {run.reruns} batches written again, "
                        f"{run.failures} query failures restarted")
    return result


__all__ = [
    "SPECULATIVE",
    "SPECULATIVE_DRIVER",
    "ByBatch",
    "drive",
    "mismatched",
    "result_of",
    "sample",
    "speculative_run",
    "wrong_windows",
]
