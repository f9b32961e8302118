"""Repairing a loss with a replay by time: :func:`repair` completes the stuck windows of
a query's sink exactly once. It waits until they are final, replays their time range
(:func:`lowtide.spark.pipeline.replay.replay_slots`) into a staging folder beside the
output, keeps the replayed rows of the stuck windows the output lacks (``exceptAll`` on
every column, labels included: acks are deterministic, rule 5), refuses unless their
count per window is what the tracker misses, writes them to the output as one batch that
a rerun does not write again, and only then acks their receipt at the sink, one
idempotent batch (rule 6). A table that feeds readers sends them into the readers'
segments first, as its sink does (rule 2).

Repair needs an output that keeps the labels (``write_table``, or ``write_parquet(...,
keep_tracking_columns=True)``) and a query without stateful steps (a window's output
time is not its input's). It completes the sink's windows only: a stuck window there
has its bound passed, so none of its rows is still upstream, and a window whose rows
were only slow is committed by its own batch before the repair writes (it waits for the
query's batches, and the stuck report must still name the window with the same count).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lowtide.spark.operators.frames import FrameSpec
from lowtide.spark.operators.tracked import OpSpec
from lowtide.spark.pipeline.replay import Loss, ReplayRefused, losses_of, replay_slots
from lowtide.spark.pipeline.stream import Stream, TransformSpec
from lowtide.spark.sinks.batches import BatchFiles, digest
from lowtide.spark.sinks.tables import TableWriter, label_sums
from lowtide.spark.tracking.column import TIME_COL, AckAccumulator
from lowtide.spark.tracking.transport import batch_key, connect

if TYPE_CHECKING:
    from lowtide.spark.pipeline.builder import Pipeline
    from lowtide.spark.pipeline.query import TrackedQuery

__all__ = ["Output", "Repaired", "Target", "output_of", "read_output", "repair"]

STAGING = "_lowtide_replay"  # leading "_": Spark's file source skips it
#: how far the tracker's clock and the driver's may differ (a remote tracker)
BATCH_CLOCK_SLACK_MS = 1_000


@dataclass(frozen=True)
class Output:
    """Where a query's sink keeps its rows with their labels."""

    path: str
    format: str  # "parquet" | "delta"
    feeds: tuple[str, ...] = ()


@dataclass(frozen=True)
class Repaired:
    """A repair: the losses it completed and the rows it added to the output."""

    losses: tuple[Loss, ...]
    rows: int


def output_of(sink: tuple[Any, ...]) -> Output | None:
    """The labelled output of a query's sink (as ``Pipeline._start`` got it), if any."""
    if sink[0] == "writer" and sink[1].get("keepTrackingColumns") == "true":
        return Output(sink[1]["path"], "parquet")
    if sink[0] == "foreach" and isinstance(sink[1], TableWriter):
        config = sink[1].config
        return Output(config.path, config.format, config.feeds)
    return None


@dataclass(frozen=True)
class Target:
    """What a repair completes: the sink ``sink`` of ``stream`` (described on ``pipe``,
    whose tracker reports the loss), whose rows are in ``output``."""

    pipe: Pipeline
    stream: Stream
    sink: str
    output: Output
    query: Any = None  # the running StreamingQuery, when this process runs it

    @classmethod
    def of(cls, query: TrackedQuery) -> Target:
        output = output_of(query.sink_spec) if query.sink_spec is not None else None
        if output is None or query.stream is None:
            raise ReplayRefused("repair needs an output that keeps the labels: write_table, "
                                "or write_parquet(..., keep_tracking_columns=True)")
        return cls(query.pipeline, query.stream, query.sink, output, query.query)


def _check_repairable(query: Target, found: list[Loss], status: dict[str, Any]) -> None:
    """A replay completes losses at the sink: their bound passed, so no row of their
    windows is still upstream (rule 4). Refused if there are none but losses
    elsewhere, if the sink has duplicates, or if the query keeps state."""
    if not any(loss.segment == query.sink for loss in found):
        raise ReplayRefused(f"the loss is in segment {found[0].segment!r}, not at the sink "
                            f"{query.sink!r}: repair completes a sink's windows; replay the "
                            "range into a fresh output with pipe.replay")
    if any(int(w.get("extra", 0)) for w in status.get("stuck_detail", [])
           if w["segment"] == query.sink):
        raise ReplayRefused("a stuck window of the sink has extra items (duplicates): a "
                            "replay adds rows, it cannot take any back")
    stateless = (OpSpec, TransformSpec, FrameSpec)
    if any(not isinstance(step, stateless) for step in query.stream.steps):
        raise ReplayRefused("repair replays stateless steps (a window's output time is not "
                            "its input's): replay the range into a fresh output with pipe.replay")


def repair(query: TrackedQuery | Target, timeout_s: float = 300.0,
           settle_s: float = 5.0) -> Repaired:
    """Complete the stuck windows of ``query``'s sink with the rows a replay of their
    time range finds missing from its output; see the module docstring. ``settle_s``:
    how long the sink's stuck windows must stay the same before they count as lost."""
    query = query if isinstance(query, Target) else Target.of(query)
    pipe, output = query.pipe, query.output
    status = pipe.tracker.status()
    found = losses_of(status, query.stream)
    if not found:
        return Repaired((), 0)
    _check_repairable(query, found, status)
    found = _settled(query, settle_s, timeout_s)
    if not found:
        return Repaired((), 0)
    name = hashlib.sha256(repr((output.path, query.sink, [(x.start, x.end) for x in found]))
                          .encode()).hexdigest()[:16]
    staging = Path(output.path) / STAGING / name
    shutil.rmtree(staging, ignore_errors=True)
    replay_slots(pipe, query.stream, min(x.start for x in found), max(x.end for x in found),
                  str(staging / "rows"), query.sink, timeout_s)
    # a window that was only slow has completed by now: only those still stuck count
    found = _still_stuck(pipe.tracker.status(), found)
    rows = _complete(query, output, found, staging, f"replay-{name}") if found else 0
    shutil.rmtree(staging, ignore_errors=True)
    return Repaired(tuple(found), rows)


def _sink_losses(query: Target) -> list[Loss]:
    return [x for x in losses_of(query.pipe.tracker.status(), query.stream)
            if x.segment == query.sink]


def _batches_done(query: Any, since_ms: int) -> bool:
    """Has every micro-batch that could still deliver rows sent before ``since_ms``
    ended? True once the query runs no batch, or a batch it started after then has
    ended (batches run one after another)."""
    if not query.status.get("isTriggerActive", False):
        return True
    last = query.lastProgress
    if not last:
        return False
    started = datetime.fromisoformat(str(last["timestamp"]).replace("Z", "+00:00"))
    return started.timestamp() * 1000 > since_ms


def _settled(query: Target, settle_s: float, timeout_s: float) -> list[Loss]:
    """The sink's losses once they are final. A stuck window's rows were all sent into
    the sink before it was first reported (its bound had passed), by batches of the
    query that writes the sink: once those batches ended, each row of it was received
    or lost. With the query in this process, wait for that, then read the report again;
    else, until the windows stayed the same for ``settle_s``."""
    deadline = time.monotonic() + timeout_s
    last: list[tuple[int, int]] | None = None
    since = time.monotonic()
    while found := _sink_losses(query):
        if query.query is not None:
            newest = max(x.since_ms for x in found) + BATCH_CLOCK_SLACK_MS
            if _batches_done(query.query, newest):
                return [x for x in _sink_losses(query)
                        if x.since_ms + BATCH_CLOCK_SLACK_MS <= newest]
        elif [(x.start, x.missing) for x in found] != last:
            last, since = [(x.start, x.missing) for x in found], time.monotonic()
        elif time.monotonic() - since >= settle_s:
            return found
        if time.monotonic() > deadline:
            raise ReplayRefused(f"the stuck windows of {query.sink!r} kept changing for "
                                f"{timeout_s:.0f} s: batches are still running; repair later")
        time.sleep(0.5)
    return []


def _still_stuck(status: dict[str, Any], found: list[Loss]) -> list[Loss]:
    now = {(w["segment"], int(w["window_start"]), int(w["missing"]))
           for w in status.get("stuck_detail", [])}
    return [x for x in found if (x.segment, x.start, x.missing) in now]


def _complete(query: Target, output: Output, found: list[Loss], staging: Path,
              key: str) -> int:
    """Write the replayed rows the output lacks in ``found``'s windows, then ack them at
    the sink (and first into the readers a table feeds); returns how many."""
    pipe = query.pipe
    missing = staging / "missing"  # materialised: writing them changes what they differ from
    (_missing_rows(pipe.spark, staging / "rows", output, found, key)
     .coalesce(1).write.parquet(str(missing)))
    times, xors, counts = label_sums(pipe.spark.read.parquet(str(missing)))
    _check_counts(found, times, counts)
    ref = pipe.tracker_ref
    agent = connect(ref)
    if output.feeds:  # into the readers before the rows are written, as the sink does
        acc = AckAccumulator()
        for reader in output.feeds:
            acc.add_reduced(ref.graph.index(reader), times, xors, counts)
        agent.send_batch(batch_key(key, 0, f"<table>{query.sink}", 0),
                         acc.build(ref.grid.window_slots))
    _write(pipe.spark, missing, output, key, digest(times, xors, counts))
    acc = AckAccumulator()
    acc.add_reduced(ref.graph.index(query.sink), times, xors, -counts)
    agent.send_batch(batch_key(key, 0, query.sink, 0), acc.build(ref.grid.window_slots))
    return int(counts.sum())


def _in_windows(df: Any, found: list[Loss]) -> Any:
    from pyspark.sql import functions as F

    cond = None
    for loss in found:
        one = (F.col(TIME_COL) >= loss.start) & (F.col(TIME_COL) < loss.end)
        cond = one if cond is None else cond | one
    return df.where(cond)


def read_output(spark: Any, output: Output) -> Any:
    reader = spark.read.format("delta") if output.format == "delta" else spark.read
    return reader.load(output.path) if output.format == "delta" else reader.parquet(output.path)


def _missing_rows(spark: Any, replayed: Path, output: Output, found: list[Loss],
                  key: str) -> Any:
    """The replayed rows of the stuck windows that the output lacks (as a multiset),
    not counting the rows an earlier run of this repair wrote (it is rerun after a crash
    between its write and its ack)."""
    from pyspark.sql import functions as F

    rows = _in_windows(spark.read.parquet(str(replayed)), found)
    have = _in_windows(read_output(spark, output), found)
    ours = _files_of(output, key)
    if ours:
        have = have.where(~F.input_file_name().isin(ours))
    return rows.exceptAll(have.select(*rows.columns))


def _files_of(output: Output, key: str) -> list[str]:
    """The URIs of the files an earlier run of repair ``key`` added to the output."""
    folder = Path(output.path).resolve()
    if output.format != "delta":
        return [p.as_uri() for p in folder.glob(BatchFiles(folder, key, 0).name("*"))]
    for commit in sorted((folder / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line]
        if any(a.get("txn", {}).get("appId") == f"lowtide-{key}" for a in actions):
            return [(folder / a["add"]["path"]).as_uri() for a in actions if "add" in a]
    return []


def _check_counts(found: list[Loss], times: np.ndarray, counts: np.ndarray) -> None:
    for loss in found:
        inside = (times >= loss.start) & (times < loss.end)
        got = int(counts[inside].sum())
        if got != loss.missing:
            raise ReplayRefused(
                f"segment {loss.segment!r} slots [{loss.start}, {loss.end}): the replay finds "
                f"{got} row(s) the output lacks, the tracker misses {loss.missing} (a step "
                "that is not deterministic?); nothing was written")


def _write(spark: Any, missing: Path, output: Output, key: str, rows_digest: str) -> None:
    """The rows as one batch of the output that a rerun of the repair does not write
    again (Delta: ``txnAppId``; Parquet: a batch file of the repair's own name)."""
    if output.format == "delta":
        (spark.read.parquet(str(missing)).write.format("delta").mode("append")
         .option("txnAppId", f"lowtide-{key}").option("txnVersion", 0).save(output.path))
        return
    files = BatchFiles(Path(output.path), key, 0)
    if files.committed(rows_digest):
        return
    parts = sorted(missing.glob("part-*.parquet"))
    files.publish([(p, f"{i:05d}") for i, p in enumerate(parts)], rows_digest)
