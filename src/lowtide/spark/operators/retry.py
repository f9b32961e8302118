"""A retry loop (rule 11): a tracked map whose failed rows go round again, keeping their
time, until they succeed or are given up.

::

    def score(batch):           # an Arrow batch -> the output, plus an "error" column
        ...                     # (null: the row succeeded; a string: it failed, why)
    scored = stream.map(score, "user string, score double", name="score",
                        retry=lowtide.RetryPolicy(attempts=3, path="/data/score-retries"))

The step's input is its stream's rows unioned with the rows read back from its loop
(:mod:`lowtide.spark.sources.loop_source`); each row carries ``lt_attempt`` (0 the
first time), which the function sees. Per input row, one of three:

* succeeded (``error`` null): the output row goes on, a child at the row's time;
* failed with attempts left: the input row, ``lt_attempt + 1``, is written to a loop
  file and sent into the loop segment ``<step>.retry`` as a child at the row's time,
  with a fresh id per attempt (child index 1 of its parent: rule 5, so a re-run task
  writes the same file and sends the same acks, rule 6);
* failed on its last attempt: written to the dead-letter output (``dead_letter/``,
  Parquet, with ``error``, ``lt_attempt`` = attempts made, ``lt_time``, ``lt_ack``) and
  received without a child, like a filtered row.

The step's segment and the loop segment form one component of the segment graph:
they share one min time, bounded by what feeds the step from outside. A row waiting
for its retry (in the step's segment, in a loop file, or read back) holds every window
downstream at or above its time; a window is emitted once its rows are done or given
up. The task writes its files before it submits its keyed batch, and receives its
input rows in that same batch: a file whose acks never arrived (the task or the query
died in between) leaves its parents in flight in the step's segment, and the batch
run again writes the same file. The function must be deterministic in (row,
``lt_attempt``), as every tracked step's (rule 5).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.spark.operators.tracked import HOLD_OUTPUT_BYTES, Waiter, hold_back, operator_id
from lowtide.spark.operators.tracked import _as_batch as as_batch
from lowtide.spark.sources.log_source import submit_task_batch
from lowtide.spark.sources.loop_source import NAME as LOOP_SOURCE
from lowtide.spark.sources.loop_source import LoopSource
from lowtide.spark.sources.retry_log import (
    DEAD_DIR,
    LOOP_DIR,
    RetryCounts,
    retry_counts,
    write_rows,
)
from lowtide.spark.tracking.column import (
    ACK_COL,
    TIME_COL,
    TRACK_COL,
    AckAccumulator,
    ack_ids,
    attach,
    child_ids,
    operator_salt,
    reference_slot,
    slots_of,
    with_ids,
)
from lowtide.spark.tracking.transport import TrackerRef, task_identity

ATTEMPT_COL = "lt_attempt"
LOOP_SUFFIX = ".retry"


@dataclass(frozen=True)
class RetryPolicy:
    """How a step retries its failed rows: ``attempts`` in all (the first included),
    then the row is given up; ``path``: the loop's directory (loop files, and the
    dead-letter output in ``path/dead_letter``), one per step and checkpoint;
    ``error_col``: the function's column that marks a failed row (non-null)."""

    attempts: int = 3
    path: str = ""
    error_col: str = "error"

    def build(self, step: str) -> RetryPolicy:
        """This policy, checked for ``step`` (one-line errors where it is described)."""
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"step {step!r}: RetryPolicy(attempts={self.attempts!r}) must "
                             "be an int >= 1 (the first attempt included)")
        if not self.path:
            raise ValueError(f"step {step!r}: RetryPolicy needs path= (a directory for the "
                             "loop's rows and the dead letters)")
        return self

    @property
    def dead_letter_path(self) -> str:
        """The dead-letter output: ``spark.read.parquet(policy.dead_letter_path)``."""
        return str(Path(self.path, DEAD_DIR))

    def status(self) -> RetryCounts:
        """Rows waiting in loop files, rows given up (see :func:`retry_counts`)."""
        return retry_counts(self.path)


@dataclass(frozen=True)
class RetrySpec:
    """A tracked map with a retry loop: its segment, and its loop segment
    (``<name>.retry``) between it and the loop source."""

    name: str
    fn: Callable[[Any], Any]
    schema: Any
    policy: RetryPolicy

    def segments(self) -> list[str]:
        return [self.name]

    @property
    def loop(self) -> str:
        """The loop segment: sent into by this step, received by the loop source."""
        return self.name + LOOP_SUFFIX

    def runtime(self, ref: TrackerRef, out_segment: str) -> RetryRuntime:
        return RetryRuntime(self.fn, ref, self.name, out_segment, self.loop,
                            operator_id(self.name), self.policy)


@dataclass(frozen=True)
class RetryRuntime:
    """What a task of the step needs; pickled into the mapInArrow closure."""

    fn: Callable[[Any], Any]
    ref: TrackerRef
    in_segment: str
    out_segment: str
    loop_segment: str
    op_id: int
    policy: RetryPolicy

    @cached_property
    def salt(self) -> int:
        return operator_salt(self.op_id)


@dataclass
class Outcome:
    """One input batch split three ways: output rows (tracking column attached), rows
    for the loop (the input's columns, ``lt_attempt`` raised), dead letters."""

    out: Any
    loop: Any
    dead: Any


def split_outcome(rt: RetryRuntime, batch: Any, acc: AckAccumulator,
                  ref_slot: int) -> Outcome:
    """Run the function on one input batch (its ``lt_track`` column included); record
    the receipts, the outputs' and the loop rows' send-acks in ``acc``."""
    import pyarrow as pa

    names = batch.schema.names
    packed = np.asarray(batch.column(names.index(TRACK_COL)).to_numpy(), np.int64)
    data = batch.drop_columns([TRACK_COL])
    res, errors, failed = _call(rt, data, len(packed))
    attempt = np.asarray(data[ATTEMPT_COL].to_numpy(zero_copy_only=False), np.int64)
    again = failed & (attempt + 1 < rt.policy.attempts)
    dead = failed & ~again
    ok = ~failed
    graph, parents = rt.ref.graph, ack_ids(packed).astype(np.uint32)
    acc.add_packed(graph.index(rt.in_segment), packed, ref_slot, -1)
    ok_packed = with_ids(packed[ok], child_ids(parents[ok], rt.salt).astype(np.uint64))
    acc.add_packed(graph.index(rt.out_segment), ok_packed, ref_slot, +1)
    index = np.ones(int(again.sum()), np.uint32)  # a loop child, not the output's
    loop_packed = with_ids(packed[again],
                           child_ids(parents[again], rt.salt, index).astype(np.uint64))
    acc.add_packed(graph.index(rt.loop_segment), loop_packed, ref_slot, +1)
    out = attach(res.filter(pa.array(ok)), ok_packed)
    loop = _with_attempts(batch.filter(pa.array(again)), attempt[again] + 1, loop_packed)
    letters = _dead_letters(batch, dead, attempt + 1, (rt.policy.error_col, errors),
                            packed, ref_slot)
    return Outcome(out, loop, letters)


def _call(rt: RetryRuntime, data: Any, n: int) -> tuple[Any, Any, np.ndarray]:
    """The function's output on ``n`` rows without its error column, the error
    column, and which rows failed (a non-null error)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    res = as_batch(rt.fn(data))
    if res.num_rows != n:
        raise ValueError(f"step {rt.in_segment!r} returned {res.num_rows} rows for {n}: a "
                         "retried map returns one row per input row")
    if rt.policy.error_col not in res.schema.names:
        return res, pa.nulls(n, pa.string()), np.zeros(n, bool)
    errors = res[rt.policy.error_col]
    failed = np.asarray(pc.is_valid(errors).to_numpy(zero_copy_only=False), bool)
    return res.drop_columns([rt.policy.error_col]), errors, failed


def _with_attempts(rows: Any, attempts: np.ndarray, packed: np.ndarray) -> Any:
    """``rows`` (the step's input columns, ``lt_track`` included) with ``lt_attempt``
    set to ``attempts`` and ``lt_track`` to ``packed``, in place: the loop source's
    schema is the step's input's."""
    import pyarrow as pa

    for name, values in ((ATTEMPT_COL, attempts), (TRACK_COL, packed)):
        i = rows.schema.names.index(name)
        rows = rows.set_column(i, rows.schema.field(i), pa.array(values, rows.schema.field(i).type))
    return rows


def _dead_letters(batch: Any, dead: np.ndarray, attempts: np.ndarray,
                  errors: tuple[str, Any], packed: np.ndarray, ref_slot: int) -> Any:
    """The rows given up: their columns, ``lt_attempt`` (attempts made), the error
    column, ``lt_time`` (full slot) and ``lt_ack``."""
    import pyarrow as pa

    mask = pa.array(dead)
    mine = packed[dead]
    rows = _with_attempts(batch.filter(mask), attempts[dead], mine).drop_columns([TRACK_COL])
    name, values = errors
    return (rows.append_column(name, values.filter(mask).cast(pa.string()))
            .append_column(TIME_COL, pa.array(slots_of(mine, ref_slot), pa.int64()))
            .append_column(ACK_COL, pa.array(ack_ids(mine).astype(np.int64), pa.int64())))


def retry_task(rt: RetryRuntime) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function given to ``mapInArrow``: each input batch split (:func:`split_outcome`);
    once the input is exhausted, the loop file and the dead letters are written, then
    the task's keyed batch submitted (receipts, outputs and loop rows together: rule 2),
    the held outputs emitted, and the confirmation waited for (rule 6)."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        acc = AckAccumulator()
        ref_slot = reference_slot(rt.ref.grid)
        loops: list[Any] = []
        letters: list[Any] = []
        sent: list[Waiter] = []

        def split(batch: Any) -> Any:
            outcome = split_outcome(rt, batch, acc, ref_slot)
            loops.append(outcome.loop)
            letters.append(outcome.dead)
            return outcome.out

        def before_held() -> None:
            ident = task_identity()
            write_rows(rt.policy.path, LOOP_DIR, ident.batch_id, ident.partition, loops)
            write_rows(rt.policy.path, DEAD_DIR, ident.batch_id, ident.partition, letters)
            sent.append(submit_task_batch(rt.ref, rt.in_segment, ident.partition, acc))

        yield from hold_back((split(b) for b in batches), HOLD_OUTPUT_BYTES, before_held)
        for s in sent:
            s.wait()

    return run


def loop_input(df: Any, step: RetrySpec, ref: TrackerRef) -> Any:
    """The step's input: ``df`` with ``lt_attempt`` 0, unioned with the rows its loop
    source reads back."""
    from pyspark.sql import functions as F

    if ATTEMPT_COL in df.columns or step.policy.error_col in df.columns:
        raise ValueError(f"step {step.name!r}: its input has a column named "
                         f"{ATTEMPT_COL!r} or {step.policy.error_col!r}, which the retry "
                         "loop adds: rename it (or RetryPolicy(error_col=...))")
    first = df.withColumn(ATTEMPT_COL, F.lit(0))
    spark = df.sparkSession
    spark.dataSource.register(LoopSource)
    options = {"path": step.policy.path, "schema": first.schema.json(),
               "lowtide.tracker": ref.to_option(), "lowtide.segment": step.loop,
               "lowtide.out": step.name}
    again = spark.readStream.format(LOOP_SOURCE).options(**options).load()
    return first.unionByName(again)


__all__ = ["ATTEMPT_COL", "RetryPolicy", "RetryRuntime", "RetrySpec", "loop_input",
           "retry_task", "split_outcome"]
