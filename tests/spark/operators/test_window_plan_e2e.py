"""End to end, windows planned in Spark's JVM: which plan a window gets; the sink never
passes a window Spark has not emitted yet (the hold), through a lagging front, injected
task failures and a restart from the checkpoint, with every window once and equal to a
batch recomputation; at the end of a stream, with no row arriving any more, every
complete window is emitted (the clock); and a first micro-batch wider than the
compiled ack kernels' table is exact."""

from __future__ import annotations

import glob
import re
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.bench.chaos.late_listener_fault import (
    counting_window,
    late_listener_run,
    send_rounds,
)
from lowtide.spark.sources.generator import GeneratorSpec
from lowtide.spark.sources.ingest import IngestReader
from tests.spark.helpers import Watcher, fail_once, t0_of_checkpoint
from tests.spark.operators.helpers import (
    AGG_COLS,
    GRID,
    STUCK_MS,
    all_input,
    batch_windows,
    check,
    parse,
    read_results,
    run_timed,
    start_slots,
)

pytestmark = pytest.mark.spark

SIZE = 100  # slots: 1 second

try:  # the workers cannot import this test module: ship its functions by value
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
except ImportError:  # pragma: no cover
    pass


def emitted(out: Path) -> set[tuple[str, int]]:
    """(user, start slot) of every window in the sink's published files."""
    got: set[tuple[str, int]] = set()
    for f in glob.glob(str(out / "*.parquet")):
        try:
            t = pq.read_table(f, columns=["user", "window_start"]).to_pandas()
        except (OSError, pa.ArrowInvalid):  # a file being published
            continue
        got.update(zip(t["user"], start_slots(t), strict=True))
    return got


def test_which_plan_a_window_gets(spark, tmp_path: Path) -> None:
    pipe = lowtide.Pipeline(spark, "which", grid=GRID)
    src = pipe.generate(GeneratorSpec(fronts=1, rate=10.0, payload_bytes=4)).map(
        parse, "front int, seq long, user string, amount double", name="parse")
    agg = src.window("1 second", key="user", name="w").agg(n="count")
    applied = src.window("1 second", key="user", name="w").apply(
        lambda rows: {"n": len(rows)}, "n long")
    try:
        jvm = pipe.build(agg, checkpoint=str(tmp_path / "a")).df
        plan = jvm._jdf.queryExecution().analyzed().toString()
        # one watermark node, the stamps'; the window's time column is marked by its
        # metadata (a node of its own would cost every row its statistics)
        assert plan.count("EventTimeWatermark") == 1 and "Aggregate" in plan
        assert re.search(r"EventTimeWatermark [^\n]*lt_wm#", plan)
        assert "TransformWithState" not in plan
        # the rows' times come from the receive step: no unwrap of lt_track to plan in
        # every micro-batch
        assert "shiftright" not in plan
        for df in (pipe.build(applied, checkpoint=str(tmp_path / "b")).df,
                   pipe.build(agg).df):  # no checkpoint (a custom sink): the fallback
            assert "TransformWithState" in df._jdf.queryExecution().analyzed().toString()
    finally:
        pipe.close()


def test_sink_never_passes_an_unemitted_window(spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4, lag_ms={1: 700})
    pipe = lowtide.Pipeline(spark, "hold", grid=GRID, stuck_after_ms=STUCK_MS)
    before = fail_once(lambda b, p: b % 5 == 3 and p == 0)
    after = fail_once(lambda b, p: b % 4 == 2)
    stream = (pipe.generate(spec)
              .map(parse, "front int, seq long, user string, amount double", name="parse")
              .transform(lambda df: df.mapInArrow(before, df.schema))
              .window("1 second", key="user", name="win")
              .agg(n="count", total=("amount", "sum"), lo=("amount", "min"),
                   hi=("amount", "max"), avg=("amount", "mean"))
              .transform(lambda df: df.mapInArrow(after, df.schema)))
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    watcher = query = None
    try:
        pipe.start_tracker(stream.graph())
        watcher = Watcher(pipe.tracker.agent, "sink", lambda: emitted(out)).start()
        query = stream.write_parquet(str(out), checkpoint=str(ckpt), trigger="200 milliseconds")
        t0 = t0_of_checkpoint(ckpt, query)
        first_end = (GRID.slot_of(t0) // SIZE + 2) * SIZE
        watcher.wait_for(first_end, 120, query.query)
        query.stop(graceful_s=0)  # likely mid-batch: that batch re-runs after the restart
        target = watcher.latest() + 3 * SIZE
        query = stream.write_parquet(str(out), checkpoint=str(ckpt), trigger="200 milliseconds")
        watcher.wait_for(target, 120, query.query)
        assert not query.stuck()
    finally:
        if query is not None:
            query.stop()
        if watcher is not None:
            watcher.stop()
        pipe.close()
    final = watcher.latest()
    expected = batch_windows(all_input(spec, t0, final), SIZE, SIZE)
    ends = expected.assign(end=expected["start"] + SIZE)
    for n in watcher.seen:  # no notification ran ahead of the emitted windows
        early = [(u, s) for u, s, e in zip(ends["user"], ends["start"], ends["end"],
                                           strict=True) if e <= n.time and (u, s) not in
                 n.snapshot]
        assert not early, f"the sink passed {n.time} before windows {early[:3]} were out"
    assert len([n for n in watcher.seen if n.time >= first_end]) >= 2
    results = read_results(out)
    horizon = max(final, int(start_slots(results).max()) + SIZE)
    expected = batch_windows(all_input(spec, t0, horizon), SIZE, SIZE)
    check(results, expected, horizon, SIZE, AGG_COLS)  # once each, equal to the batch


def counting(spark: Any, name: str, log: Path) -> tuple[Any, Any]:
    """A pipeline counting ``log``'s records per 200 ms window, and its stream."""
    pipe = lowtide.Pipeline(spark, name, grid=GRID, stuck_after_ms=STUCK_MS)
    return pipe, counting_window(pipe, log)


def two_fronts(pipe: Any, stream: Any) -> list[Any]:
    """Start the tracker of ``stream``'s graph; two fronts writing its log."""
    pipe.start_tracker(stream.graph())
    return [pipe.front(f, fsync="never", heartbeat_ms=10) for f in (0, 1)]


def write(stream: Any, tmp_path: Path) -> Any:
    return stream.write_parquet(str(tmp_path / "out"), checkpoint=str(tmp_path / "ckpt"),
                                trigger="200 milliseconds")


def test_end_of_stream_emits_every_window(spark, tmp_path: Path) -> None:
    """Fronts write for a while, then only heartbeat, then finish: no row arrives in
    the last micro-batches, and the clock still brings every complete window out."""
    log, out = tmp_path / "log", tmp_path / "out"
    pipe, stream = counting(spark, "end", log)
    query = None
    try:
        fronts = two_fronts(pipe, stream)
        query = write(stream, tmp_path)
        send_rounds(fronts, 15)
        time.sleep(1.0)  # heartbeats only: no data, the min time moves
        time.sleep(0.03)
        last = min(f.close() for f in fronts)
        final = query.wait_for_min_time(last, timeout_s=120)
        assert not query.stuck()
    finally:
        if query is not None:
            query.stop()
        pipe.close()
    times = []
    for f in (0, 1):
        r = IngestReader(log, f)
        times.extend(r.read(0, r.end_offset())[0].tolist())
    assert len(times) == 2 * 15 * 4
    expected = pd.Series(times).floordiv(20).mul(20).value_counts()
    got = read_results(out).assign(start=lambda d: start_slots(d))
    assert not got["start"].duplicated().any(), "a window was emitted twice"
    done = expected[expected.index + 20 <= final]
    assert set(done.index) <= set(got["start"]) and len(done) >= 4
    assert got.set_index("start")["n"].to_dict() == expected[got["start"]].to_dict()


def test_the_clock_alone_moves_the_watermark(spark, tmp_path: Path) -> None:
    """The first micro-batch reads every row while the fronts still run; then they
    finish, and no row arrives any more: only the clock's rows can move the watermark
    (before, Spark's filter of rows without a window time, pushed below the watermark
    node, dropped them first, and the windows waited for good)."""
    log, out = tmp_path / "log", tmp_path / "out"
    pipe, stream = counting(spark, "clock", log)
    query = None
    try:
        fronts = two_fronts(pipe, stream)
        send_rounds(fronts, 5)
        query = write(stream, tmp_path)
        deadline = time.monotonic() + 120
        while not any(p["numInputRows"] for p in query.recentProgress):
            assert time.monotonic() < deadline and query.exception() is None
            time.sleep(0.05)
        last = min(f.close() for f in fronts)  # after a batch read the rows
        query.wait_for_min_time(last, timeout_s=120)
        read = [p["numInputRows"] for p in query.recentProgress]
    finally:
        if query is not None:
            query.stop()
        pipe.close()
    assert read[0] >= 2 * 5 * 4  # every row in the first batch (and maybe a clock row)
    assert read_results(out)["n"].sum() == 2 * 5 * 4


def test_a_query_done_before_its_listener_would_be_added_releases_its_hold(
        spark, tmp_path: Path) -> None:
    """Every front finished before the query starts: its batches may all end before a
    listener added after ``start()`` hears of one, and the hold would stand for good.
    Here the session registers listeners only once the running queries ran out of
    batches (the race at its widest): the hold's listener catches up with the query's
    last progress, releases the hold, and every window is emitted (the chaos kind's
    own check)."""
    result = late_listener_run(spark, tmp_path)
    assert not result.notes and not result.premature and result.lost == 0


# ~12 s each: the map sender in the slow tier
@pytest.mark.slow  # ~15 s; a where absorbed by default: test_frames_crossings.py
@pytest.mark.parametrize("sender", ["source", "map"])
def test_wheres_the_window_absorbs_equal_batch(spark, tmp_path: Path, sender: str) -> None:
    """``where`` steps in front of a window planned in the JVM run as Spark's filter
    (no Python pass of their own): the senders (the source's reader, or a tracked map)
    receive for the window out of the first ``where``'s segment. Through a lagging
    front, a task failed after its receipts were sent, and a restart from the
    checkpoint, every window is emitted once and equals the batch recomputation over
    the rows the wheres keep."""
    from pyspark.sql import functions as F

    spec = GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4, lag_ms={1: 500})
    pipe = lowtide.Pipeline(spark, f"absorbed-{sender}", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = pipe.generate(spec)
    if sender == "map":
        stream = stream.map(parse, "front int, seq long, user string, amount double",
                            name="parse")
    else:  # the parse in SQL: the source's reader is the sender
        stream = (stream.with_column("user", ((F.col("seq") + F.col("front")) % 4).cast("string"))
                  .with_column("amount", (F.col("seq") % 64).cast("double")))
    fails = fail_once(lambda b, p: b % 4 == 2 and p == 0)
    stream = (stream.transform(lambda df: df.mapInArrow(fails, df.schema))
              .where("seq % 3 != 0", name="keep")
              .with_column("big", F.col("amount") >= 8)
              .where(F.col("user") != "2", name="not2")
              .window("1 second", key="user", name="win")
              .agg(n="count", total=("amount", "sum"), lo=("amount", "min"),
                   hi=("amount", "max"), avg=("amount", "mean")))
    results, t0, final = run_timed(pipe, stream, tmp_path, 4 * SIZE, restart_at=2 * SIZE)

    def kept(horizon: int) -> Any:
        rows = all_input(spec, t0, horizon)
        return rows[(rows["seq"] % 3 != 0) & (rows["user"] != "2")]

    horizon = max(final, int(start_slots(results).max()) + SIZE)
    expected = batch_windows(kept(horizon), SIZE, SIZE)
    assert len(expected[expected["start"] + SIZE <= final]) >= 6
    check(results, expected, horizon, SIZE, AGG_COLS)
    done = expected[expected["start"] + SIZE <= final]
    got = set(zip(results["user"], start_slots(results), strict=True))
    assert set(zip(done["user"], done["start"], strict=True)) <= got, "a complete window is missing"


def test_a_backlog_wider_than_the_kernels_table_is_exact(spark, tmp_path: Path) -> None:
    """A query that starts 12 minutes behind its fronts (a catch-up after an outage)
    reads them in a first micro-batch spanning 72,000 slots, more than the compiled ack
    kernels' dense table covers (``DENSE_SPAN``): the source's acks, the map's and the
    window's receipts take the numpy path, which sorts. Every window is emitted once and
    equals the batch recomputation."""
    from lowtide.service.clock import wall_ms
    from lowtide.spark.tracking.kernels import DENSE_SPAN

    behind = 12 * 60_000 // GRID.delta_ms  # slots
    assert behind > DENSE_SPAN
    spec = GeneratorSpec(fronts=2, rate=20.0, payload_bytes=4,
                         t0_ms=wall_ms() - behind * GRID.delta_ms)
    pipe = lowtide.Pipeline(spark, "backlog", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = (pipe.generate(spec).map(parse, "front int, seq long, user string, amount double",
                                      name="parse")
              .window("1 second", key="user", name="win")
              .agg(n="count", total=("amount", "sum"), lo=("amount", "min"),
                   hi=("amount", "max"), avg=("amount", "mean")))
    results, t0, final = run_timed(pipe, stream, tmp_path, behind + 3 * SIZE)
    horizon = max(final, int(start_slots(results).max()) + SIZE)
    expected = batch_windows(all_input(spec, t0, horizon), SIZE, SIZE)
    check(results, expected, horizon, SIZE, AGG_COLS)
    done = expected[expected["start"] + SIZE <= final]
    assert len(done) > 4 * 700  # four users' windows over the 12 minutes
    got = set(zip(results["user"], start_slots(results), strict=True))
    assert set(zip(done["user"], done["start"], strict=True)) <= got, "a complete window is missing"
