"""``lowtide bench chaos --spark``: the fault kinds that need real Spark queries and real
files (rule 14), each against a known ground truth (every record a producer wrote):

* ``rerun from a new checkpoint``: each file sink (``write_parquet``, ``write_table``
  Parquet and Delta) runs, stops, and reruns from a new checkpoint into the same
  folder, as a user does after an upgrade; Spark's batch ids start at 0 again;
* ``two writers of one table``: two tracked queries append to one Delta table, one
  writer's records 2 s behind the other's;
* ``a producer's clock 12 minutes slow``: a second front joins a segment that passed
  its clock, then restarts, and must not hold it until the clock catches up;
* ``rows lost in a step, replayed``: a step drops rows once, the sink's windows are
  repaired by a replay by time (:mod:`.replay_fault`);
* a retry loop under task failures and a restart (:mod:`.retry_fault`), a
  speculative window under task failures and a restart, and one whose changelog step
  runs on the driver under a sink failure and a restart (:mod:`.speculative_fault`), a
  window whose results come from the driver, with key ranges and without, under the
  same (:mod:`.ranges_fault`),
  and a standalone tracker hung (SIGSTOP) while a sink sends its acks
  (:mod:`.hung_fault`);
* ``listeners added late to a finished input``: a window query that can run every batch
  it has before a listener added after its start hears of one
  (:mod:`.late_listener_fault`).
* ``stopped while a sink writes``: a ``write_parquet`` query stopped at once while a
  micro-batch's write is half done, then restarted (:mod:`.stop_fault`).

``premature``: a time announced complete (the sink's min time, or a version's published
``complete_below``) while a record below it was not in the output; ``lost``: records
the producers wrote that are not in the output at the end.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lowtide.bench.chaos.file_truth import (
    SCHEMA,
    TRIGGER,
    Producer,
    early,
    note_premature,
    produce,
    rows_of,
    run_and_stop,
)
from lowtide.bench.chaos.hung_fault import HUNG, HUNG_TASK, hung_sink_run, hung_task_run
from lowtide.bench.chaos.late_listener_fault import LATE_LISTENER, late_listener_run
from lowtide.bench.chaos.ranges_fault import RANGES_DRIVER, WINDOW_DRIVER, ranges_run
from lowtide.bench.chaos.replay_fault import lost_and_replayed, result_of
from lowtide.bench.chaos.retry_fault import RETRY_LOOP, retry_loop_run
from lowtide.bench.chaos.retry_fault import result_of as retry_result
from lowtide.bench.chaos.run import Result
from lowtide.bench.chaos.speculative_fault import (
    SPECULATIVE,
    SPECULATIVE_DRIVER,
    speculative_run,
)
from lowtide.bench.chaos.speculative_fault import result_of as speculative_result
from lowtide.bench.chaos.stop_fault import STOPPED_IN_WRITE, stopped_in_write_run
from lowtide.service import wall_ms
from lowtide.spark import Front, Pipeline, SessionConfig, complete_below
from lowtide.spark.sources import FilesProducerConfig

LAG_MS = 2_000  # the slower writer's records, behind the clock
SLOW_MS = 12 * 60_000  # a producer machine's clock that far slow
SLOW_CLOCK = "a producer's clock 12 minutes slow"


class Behind:
    """A front's clock ``ms`` behind the wall clock (its records are older)."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def now_ms(self) -> int:
        return wall_ms() - self.ms


def delta_never_early(table: Path, expected: dict[int, int]) -> list[str]:
    """Every Delta version whose published completeness came before a record below it
    was committed (the table's files as of that version, from its log)."""
    bad, files = [], []
    for path in sorted(table.glob("_delta_log/*.json"), key=lambda p: int(p.stem)):
        v = int(path.stem)
        files += [json.loads(line)["add"]["path"] for line in path.read_text().splitlines()
                  if '"add"' in line]
        published = complete_below(table, v)
        if published is None or published.version != v:
            continue
        missing = early(published.complete_below, expected, rows_of(table, files))
        if missing:
            bad.append(f"version {v} claimed {published.complete_below} before "
                       f"{len(missing)} records below it")
    return bad


def rerun(spark: Any, tmp: Path, sink: Callable[[Any, Path, str], Any], label: str) -> Result:
    """Run 1 and a rerun from a new checkpoint into one folder (new input, the same
    front); each run's announced min time judged against the folder, and nothing lost
    at the end."""
    result = Result(f"rerun: {label}", faults=1)
    out, ground = tmp / "out", Producer()
    pipe = Pipeline(spark, f"chaos-rerun-{label}", stuck_after_ms=120_000)
    front = None
    try:
        for run in (1, 2):
            folder = tmp / f"in{run}"
            folder.mkdir(parents=True)
            stream = pipe.read_stream(spark.readStream.schema(SCHEMA).parquet(str(folder)))
            pipe.start_tracker(stream.graph())
            front = front or Front(None, 1, pipe.tracker_ref)
            query = sink(stream, out, str(tmp / f"c{run}"))
            try:
                (end,) = produce([FilesProducerConfig(folder).build(front)], ground, rounds=3)
                query.wait_for_min_time(end, "sink", timeout_s=300)
                claimed = query.min_time("sink")
            finally:
                query.stop()
            note_premature(result, claimed, ground.written, rows_of(out), f"run {run}: ")
    finally:
        if front is not None:
            front.close()
        pipe.close()
    result.lost = len(set(ground.written) - set(rows_of(out)))
    return result


def two_writers(spark: Any, tmp: Path) -> Result:
    """Two tracked queries append to one Delta table, b's records 2 s behind a's."""
    result = Result("two writers of one table", faults=1)
    table, ground = tmp / "table", Producer()
    spark.createDataFrame([], SCHEMA).write.format("delta").save(str(table))
    pipe = Pipeline(spark, "chaos-two-writers", stuck_after_ms=120_000)
    streams = {}
    for name in ("a", "b"):
        (tmp / name).mkdir(parents=True)
        df = spark.readStream.schema(SCHEMA).parquet(str(tmp / name))
        streams[name] = pipe.read_stream(df, name=f"in_{name}")
    pipe.start_tracker(pipe.plan(*((s, n) for n, s in streams.items())).graph)
    fronts = [Front(None, 1, pipe.tracker_ref, segment="in_a"),
              Front(None, 2, pipe.tracker_ref, segment="in_b", clock=Behind(LAG_MS))]
    queries = [s.write_table(str(table), checkpoint=str(tmp / f"c_{n}"), name=n,
                             writers=("a", "b"), trigger=TRIGGER) for n, s in streams.items()]
    try:
        producers = [FilesProducerConfig(tmp / n).build(f)
                     for n, f in zip(streams, fronts, strict=True)]
        for (name, q), end in zip(zip(streams, queries, strict=True),
                                  produce(producers, ground, rounds=4), strict=True):
            q.wait_for_min_time(end, name, timeout_s=300)
    finally:
        for q in queries:
            q.stop()
        for f in fronts:
            f.close()
        pipe.close()
    result.premature += delta_never_early(table, ground.written)
    held = spark.read.format("delta").load(str(table)).select("rid").toPandas()
    result.lost = len(set(ground.written) - set(held["rid"].tolist()))
    return result


def slow_clock(spark: Any, tmp: Path) -> Result:
    """A second producer whose clock is 12 minutes slow joins one segment after the
    first moved on, then restarts (a successor with its owner resumes at its promise,
    ahead of its clock): each time it counts on from where it starts. The segment must
    pass its records within a minute (before, its labels and heartbeats stayed at that
    slot until its clock caught up: 12 minutes)."""
    result = Result(SLOW_CLOCK, faults=2)
    folder, out, ground = tmp / "in", tmp / "out", Producer()
    folder.mkdir(parents=True)
    pipe = Pipeline(spark, "chaos-slow-clock", stuck_after_ms=120_000)
    fronts: list[Front] = []

    def slow_producer() -> Any:
        fronts.append(Front(None, 2, pipe.tracker_ref, clock=Behind(SLOW_MS), owner="slow"))
        return FilesProducerConfig(folder).build(fronts[-1])

    try:
        stream = pipe.read_stream(spark.readStream.schema(SCHEMA).parquet(str(folder)))
        pipe.start_tracker(stream.graph())
        fronts.append(Front(None, 1, pipe.tracker_ref))
        query = stream.write_parquet(str(out), checkpoint=str(tmp / "c"), trigger=TRIGGER,
                                     keep_tracking_columns=True)
        first = FilesProducerConfig(folder).build(fronts[0])

        def produce_to() -> int:
            produce([first], ground, rounds=2)
            produce([first, slow_producer()], ground, rounds=2, timeout_s=60)
            fronts[-1].close(end=False)  # the slow producer restarts
            return max(produce([first, slow_producer()], ground, rounds=2, timeout_s=60))

        claimed = run_and_stop(query, produce_to, result, timeout_s=120)
    finally:
        for f in fronts:
            f.close()
        pipe.close()
    have = rows_of(out)
    note_premature(result, claimed, ground.written, have)
    # records never written out, or never announced complete (they wait for good)
    result.lost = sum(1 for rid, t in ground.written.items() if t >= claimed or rid not in have)
    return result


def sinks() -> dict[str, Callable[[Any, Path, str], Any]]:
    return {
        "write_parquet": lambda s, out, ckpt: s.write_parquet(
            str(out), checkpoint=ckpt, trigger=TRIGGER, keep_tracking_columns=True),
        "write_table parquet": lambda s, out, ckpt: s.write_table(
            str(out), checkpoint=ckpt, format="parquet", trigger=TRIGGER),
        "write_table delta": lambda s, out, ckpt: s.write_table(
            str(out), checkpoint=ckpt, format="delta", trigger=TRIGGER),
    }


def run_spark(names: list[str] | None = None, spark: Any = None) -> list[Result]:
    """The Spark scenarios (``names``: a subset), on ``spark`` or a local session of
    their own (stopped at the end)."""
    own = spark is None
    try:
        spark = spark or SessionConfig(app_name="lowtide-chaos", ui=False, delta=True).build()
    except RuntimeError as missing:  # JarsMissing: the Delta jars `make setup` fetches
        raise SystemExit(f"lowtide bench chaos --spark: {missing}") from None
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="lowtide-chaos-spark-") as tmp:
            if not names or "rerun from a new checkpoint" in names:
                for k, (label, sink) in enumerate(sinks().items()):
                    results.append(timed(rerun, spark, Path(tmp) / f"r{k}", sink, label))
            if not names or "two writers of one table" in names:
                results.append(timed(two_writers, spark, Path(tmp) / "w"))
            if not names or SLOW_CLOCK in names:
                results.append(timed(slow_clock, spark, Path(tmp) / "slow"))
            if not names or "rows lost in a step, replayed" in names:
                results.append(timed(lambda t: result_of(lost_and_replayed(spark, t)),
                                     Path(tmp) / "lost"))
            if not names or RETRY_LOOP in names:
                results.append(timed(lambda t: retry_result(retry_loop_run(spark, t)),
                                     Path(tmp) / "loop"))
            if not names or SPECULATIVE in names:
                results.append(timed(lambda t: speculative_result(speculative_run(spark, t)),
                                     Path(tmp) / "speculative"))
            if not names or SPECULATIVE_DRIVER in names:
                results.append(timed(lambda t: speculative_result(
                    speculative_run(spark, t, on_driver=True), SPECULATIVE_DRIVER),
                    Path(tmp) / "speculative-driver"))
            if not names or RANGES_DRIVER in names:
                results.append(timed(lambda t: ranges_run(spark, t), Path(tmp) / "ranges"))
            if not names or WINDOW_DRIVER in names:
                results.append(timed(lambda t: ranges_run(spark, t, key_ranges=0),
                                     Path(tmp) / "window"))
            if not names or HUNG in names:
                results.append(timed(lambda t: hung_sink_run(spark, t), Path(tmp) / "hung"))
            if not names or HUNG_TASK in names:
                results.append(timed(lambda t: hung_task_run(spark, t), Path(tmp) / "hung-task"))
            if not names or LATE_LISTENER in names:
                results.append(timed(lambda t: late_listener_run(spark, t),
                                     Path(tmp) / "late-listener"))
            if not names or STOPPED_IN_WRITE in names:
                results.append(timed(lambda t: stopped_in_write_run(spark, t),
                                     Path(tmp) / "stopped-in-write"))
    finally:
        if own:
            spark.stop()
    return results


def timed(scenario: Callable[..., Result], *args: Any) -> Result:
    start = time.monotonic()
    result = scenario(*args)
    result.seconds = time.monotonic() - start
    print(f"  {result.name}: {len(result.premature)} premature, {result.lost} lost,"
          f" {result.seconds:.1f} s", flush=True)
    return result


__all__ = ["run_spark"]
