"""The per-front filter of ``read_stream(joins_dir=)`` (issue 34 review point 3), on
real files and Arrow batches (no Spark, no tracker): a task reads the joins directory
once and keeps the answers for its later batches; an answer written after a batch was
planned is seen by the next batch (a new task) and never applied to part of a batch:
the task that missed it keeps exactly the rows a retry that sees it keeps.

Worked example: front 0 answered at time 100, front 1 answers at 200 during batch 1.
Batch 1 (planned before that answer) holds front 0's rows at 90 and 100 and front 1's
at 150: it keeps front 0's row at 100 only. Batch 2 holds front 1's rows at 199 and
200: it keeps the one at 200."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

from lowtide.spark.sources.joins import Join, record_join, request_join
from lowtide.spark.sources.read_stream import Labels
from lowtide.spark.tracking import AckAccumulator
from lowtide.spark.tracking.column import TRACK_COL, slots_of

SEGMENT = "in_b"


def rows(*items: tuple[int, int]) -> pa.RecordBatch:
    """(front, time) records as a topic holds them, their acks numbered."""
    fronts, times = (np.array(c, np.int64) for c in zip(*items, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(np.arange(len(items), dtype=np.int64)), pa.array(times),
         pa.array(np.arange(1, len(items) + 1, dtype=np.int64) * 7919), pa.array(fronts)],
        names=["v", "lt_time", "lt_ack", "lt_front"])


def task(joins: Path) -> Labels:
    """One task's copy of the entry's step, as Spark ships it (pickled per task)."""
    labels = Labels("lt_time", "lt_ack", SEGMENT, str(joins))
    return pickle.loads(pickle.dumps(labels))


def kept(step: Labels, batch: pa.RecordBatch) -> list[int]:
    """The label times of the rows the entry keeps."""
    out = step(batch, AckAccumulator(), 0, 1, 0)
    return sorted(slots_of(np.asarray(out.column(TRACK_COL)), 0).tolist())


def asked(tmp_path: Path) -> Path:
    joins = tmp_path / "joins_dir"
    request_join(joins, SEGMENT, consumer=SEGMENT)
    record_join(joins, SEGMENT, front=0, join=Join(offset=0, time=100, front_id=1 << 32))
    record_join(joins, "in_a", front=1, join=Join(offset=0, time=-1, front_id=1))
    return joins


def test_a_task_reads_the_joins_directory_once(tmp_path: Path) -> None:
    joins = asked(tmp_path)
    step = task(joins)
    assert kept(step, rows((0, 90), (0, 100), (1, 150))) == [100]
    shutil.rmtree(joins)  # the task's later batches do not look again
    assert kept(step, rows((0, 95), (0, 120), (1, 160))) == [120]
    assert kept(task(joins), rows((0, 95), (0, 120))) == [95, 120]  # a new task does


def test_an_answer_written_after_a_batch_was_planned_is_seen_by_the_next_batch(
        tmp_path: Path) -> None:
    joins = asked(tmp_path)
    first = rows((0, 90), (0, 100), (1, 150))
    step = task(joins)
    assert kept(step, first.slice(0, 2)) == [100]  # the task's first Arrow batch ...
    record_join(joins, SEGMENT, front=1, join=Join(offset=0, time=200, front_id=1 | 1 << 32))
    assert kept(step, first.slice(2)) == []       # ... front 1 answers before its second
    # never half-applied: a retry of batch 1 (it sees the answer) keeps the same rows
    assert kept(task(joins), first) == [100]
    assert kept(task(joins), rows((1, 199), (1, 200))) == [200]  # batch 2: from 200 on
