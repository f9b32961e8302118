"""The fault kind "stopped while a sink writes" (``lowtide bench chaos --spark``): a
``write_parquet`` query is stopped at once (no wait for the batch to end, as a user's
Ctrl-C or a cluster manager's kill of the driver's work does) while one task of a
micro-batch's write has staged its file and the other is still running; then it is
restarted from its checkpoint and runs on.

Ground truth: every record the producer wrote, by id.

* ``premature``: the sink's min time passed a record not in the output;
* ``lost``: records not in the output at the end;
* ``left behind``: files under the output's ``_tmp`` once the restarted query
  stopped (staged by a cancelled write and never removed: not data, but a folder
  that grows with every such stop).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

from lowtide.bench.chaos.file_truth import (
    SCHEMA,
    TRIGGER,
    Producer,
    note_premature,
    produce,
    rows_of,
    run_and_stop,
)
from lowtide.bench.chaos.run import Result
from lowtide.spark import Front, Pipeline
from lowtide.spark.sources import FilesProducerConfig

STOPPED_IN_WRITE = "stopped while a sink writes"
HANG_S = 60.0  # the slow task's longest wait for the stop


def slow_in_partition_1(batch: Any, gate: str, started: str) -> Any:
    """The step before the sink: in partition 1, while ``gate`` exists, mark
    ``started`` and wait (the stop cancels the task meanwhile); else the rows as they
    are."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is not None and tc.partitionId() == 1 and Path(gate).exists():
        Path(started).touch()
        deadline = time.monotonic() + HANG_S
        while Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return batch


def _stream(pipe: Any, folder: Path, tmp: Path) -> Any:
    stream = pipe.read_stream(pipe.spark.readStream.schema(SCHEMA).parquet(str(folder)))
    step = functools.partial(slow_in_partition_1, gate=str(tmp / "gate"),
                             started=str(tmp / "started"))
    return stream.repartition(2).map(step, "rid long", name="slow")


def _start(stream: Any, out: Path, ckpt: Path) -> Any:
    return stream.write_parquet(str(out), checkpoint=str(ckpt), trigger=TRIGGER,
                                keep_tracking_columns=True)


def stopped_in_write_run(spark: Any, tmp: Path) -> Result:
    """Run, stop in a batch's write, restart, run on; judge the output folder."""
    result = Result(STOPPED_IN_WRITE, faults=1)
    folder, out, ckpt, ground = tmp / "in", tmp / "out", tmp / "ckpt", Producer()
    folder.mkdir(parents=True)
    pipe = Pipeline(spark, "chaos-stopped-in-write", stuck_after_ms=120_000)
    front, claimed = None, 0
    try:
        stream = _stream(pipe, folder, tmp)
        pipe.start_tracker(stream.graph())
        front = Front(None, 1, pipe.tracker_ref)
        query = _start(stream, out, ckpt)
        producer = FilesProducerConfig(folder).build(front)
        produce([producer], ground, rounds=2)
        (tmp / "gate").touch()
        ground.write(producer, 20)
        _stop_when_started(query, tmp / "started", out / "_tmp", result)
        (tmp / "gate").unlink()
        query = _start(_stream(pipe, folder, tmp), out, ckpt)
        claimed = run_and_stop(query, lambda: produce([producer], ground, rounds=2)[0],
                               result, timeout_s=300)
    finally:
        if front is not None:
            front.close()
        pipe.close()
    _judge(result, claimed, ground, out)
    return result


def _stop_when_started(query: Any, started: Path, staging: Path, result: Result) -> None:
    """Stop ``query`` at once when its slow task has started and its other task has
    staged a file, at the latest after ``HANG_S``."""
    deadline = time.monotonic() + HANG_S

    def under_way() -> bool:
        return started.exists() and any(p.is_file() for p in staging.rglob("*"))

    while not under_way() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not under_way():
        result.notes.append(f"no write was under way within {HANG_S:g} s: stopped anyway")
    query.stop(graceful_s=0)


def _judge(result: Result, claimed: int, ground: Producer, out: Path) -> None:
    have = rows_of(out)
    note_premature(result, claimed, ground.written, have)
    result.lost = len(set(ground.written) - set(have))
    left = sorted(p for p in (out / "_tmp").rglob("*") if p.is_file())
    result.left_behind = len(left)
    if left:
        result.notes.append(f"{len(left)} staged files left in _tmp, e.g. {left[0].name}")
