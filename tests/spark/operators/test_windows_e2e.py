"""End to end, exact windows: results equal a batch recomputation over the whole
input (so no window was emitted before rows that arrived later), never twice; with a
lagging front, an idle and a stalled front, injected task failures and a restart from
the checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import lowtide
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once, t0_of_checkpoint
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


def not_front0(b: pa.RecordBatch) -> Any:
    return pc.not_equal(b["front"], 0)


def spread(rows: pd.DataFrame) -> dict[str, Any]:
    return {"fronts": int(rows["front"].nunique()), "span": float(rows["amount"].max()
                                                                  - rows["amount"].min())}


def run(stream: Any, tmp: Path, spec: GeneratorSpec, size: int, slide: int,
        drop_front0: bool = False, restart: bool = False,
        seconds: float = 3.0) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """Run until the sink is complete ``seconds`` past the first window (restarting
    from the checkpoint once the first window is out); returns (results, batch
    recomputation, sink min time)."""
    out, ckpt = tmp / "out", tmp / "ckpt"
    query = stream.write_parquet(str(out), checkpoint=str(ckpt), trigger="200 milliseconds")
    try:
        t0 = t0_of_checkpoint(ckpt, query)
        first_end = (GRID.slot_of(t0) // slide + 1) * slide + size
        target = first_end + int(seconds * 1000) // GRID.delta_ms
        if restart:
            query.wait_for_min_time(first_end, timeout_s=120)
            query.stop()
            # windows that started before the stop are pending in the state store
            target = max(target, query.min_time() + int(seconds * 1000) // GRID.delta_ms)
            query = stream.write_parquet(str(out), checkpoint=str(ckpt),
                                         trigger="200 milliseconds")
        query.wait_for_min_time(target, timeout_s=120)
        assert not query.stuck()
    finally:
        query.stop()
    final = query.min_time()
    results = read_results(out)
    horizon = max(final, int(start_slots(results).max()) + size)
    expected = batch_windows(all_input(spec, t0, horizon, drop_front0), size, slide)
    done = expected[expected["start"] + size <= final]
    got = set(zip(results["user"], start_slots(results), strict=True))
    missing = [k for k in zip(done["user"], done["start"], strict=True) if k not in got]
    assert not missing, f"complete windows not emitted: {missing[:5]}"
    assert len(done) >= 4
    return results, expected, horizon


@pytest.mark.slow  # ~14 s; a lagging front by default: test_task_failures_and_restart_...
def test_tumbling_with_a_lagging_front_equals_batch(spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=3, rate=240.0, payload_bytes=4, lag_ms={2: 1500})
    pipe = lowtide.Pipeline(spark, "win-lag", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = (pipe.generate(spec)
              .map(parse, "front int, seq long, user string, amount double", name="parse")
              .window("1 second", key="user", name="win")
              .agg(n="count", total=("amount", "sum"), lo=("amount", "min"),
                   hi=("amount", "max"), avg=("amount", "mean")))
    assert stream.segment_names() == ["parse", "win", "win.state", "sink"]
    try:
        results, expected, horizon = run(stream, tmp_path, spec, 100, 100)
    finally:
        pipe.close()
    check(results, expected, horizon, 100, AGG_COLS)
    assert list(results.columns[:3]) == ["user", "window_start", "window_end"]


@pytest.mark.slow  # ~10 s; sliding by default: test_slot_logic.py; lag: the tumbling test
def test_sliding_apply_with_idle_and_stalled_fronts(spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=3, rate=240.0, payload_bytes=4, stall={1: (1000, 1500)})
    pipe = lowtide.Pipeline(spark, "win-idle", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = (pipe.generate(spec)
              .map(parse, "front int, seq long, user string, amount double", name="parse")
              .filter(not_front0, name="keep")  # front 0 is idle for the window
              .window("1 second", key="user", slide="500 milliseconds", name="win")
              .apply(spread, "fronts long, span double"))
    try:
        results, expected, horizon = run(stream, tmp_path, spec, 100, 50, drop_front0=True)
    finally:
        pipe.close()
    check(results, expected, horizon, 100, ["fronts", "span"])


def test_task_failures_and_restart_from_checkpoint(spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4, lag_ms={1: 600})
    pipe = lowtide.Pipeline(spark, "win-fail", grid=GRID, stuck_after_ms=STUCK_MS)
    after = fail_once(lambda b, p: b % 4 == 2)
    before = fail_once(lambda b, p: b % 5 == 3 and p == 0)
    stream = (pipe.generate(spec)
              .map(parse, "front int, seq long, user string, amount double", name="parse")
              .transform(lambda df: df.mapInArrow(before, df.schema))
              .window("1 second", key="user", name="win")
              .agg(n="count", total=("amount", "sum"), lo=("amount", "min"),
                   hi=("amount", "max"), avg=("amount", "mean"))
              .transform(lambda df: df.mapInArrow(after, df.schema)))
    try:
        results, expected, horizon = run(stream, tmp_path, spec, 100, 100, restart=True)
    finally:
        pipe.close()
    check(results, expected, horizon, 100, AGG_COLS)


@pytest.mark.slow  # ~15 s; sharded trackers by default: tests/service/test_sharded.py and
# the core property tests
def test_sharded_tracker_equals_batch(spark, tmp_path: Path) -> None:
    """The same exact windows against `lowtide serve --shards 2` (a coordinator and two
    shard processes): state holds, MinTimeAt and completeness go through the shards."""
    from tests.service.procs import serve  # the service tests' servers: stopped by pid

    spec = GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4, lag_ms={1: 800})
    # the server's stuck_after_ms as the embedded trackers': the window's hold stands
    # up to two micro-batches, which on a loaded machine take longer than the default 5 s
    with serve(tmp_path, "--shards", "2", "--delta-ms", str(GRID.delta_ms),
               "--stuck-after-ms", str(STUCK_MS)) as server:
        pipe = lowtide.Pipeline(spark, "win-shards", tracker=server.url, grid=GRID,
                                stuck_after_ms=STUCK_MS)
        stream = (pipe.generate(spec)
                  .map(parse, "front int, seq long, user string, amount double", name="parse")
                  .window("1 second", key="user", name="win")
                  .agg(n="count", total=("amount", "sum"), lo=("amount", "min"),
                       hi=("amount", "max"), avg=("amount", "mean")))
        try:
            results, expected, horizon = run(stream, tmp_path, spec, 100, 100)
        finally:
            pipe.close()
    check(results, expected, horizon, 100, AGG_COLS)


def test_a_nullable_long_key_keeps_its_windows_apart(spark, tmp_path: Path) -> None:
    """Grouped by a nullable long key, PySpark 4.2 handed each null-key row to its own
    call and mixed key 2's rows into the null key's state: its windows were missing
    and the null key's counted key 2's rows. The window groups by the keys' JSON."""
    from pyspark.sql import functions as F

    spec = GeneratorSpec(fronts=2, rate=150.0, payload_bytes=4)
    pipe = lowtide.Pipeline(spark, "win-null", grid=GRID, stuck_after_ms=STUCK_MS)
    k = F.when(F.col("seq") % 4 == 0, F.lit(None)).otherwise(F.col("seq") % 3)
    stream = (pipe.generate(spec).select(k.cast("long").alias("k"), "seq", name="keys")
              .window("100 milliseconds", key="k", name="w").agg(n="count"))
    results, t0, _ = run_timed(pipe, stream, tmp_path, 150)
    ms = pd.to_datetime(results["window_start"], utc=True).map(lambda t: t.value // 1_000_000)
    got = results.assign(k=results["k"].fillna(-1).astype(int), start=ms // GRID.delta_ms)
    rows = all_input(spec, t0, int(got["start"].max()) + 10)
    rows["k"] = np.where(rows["seq"] % 4 == 0, -1, rows["seq"] % 3)  # -1: the null key
    expected = rows.groupby(["k", rows["slot"] // 10 * 10]).size()
    assert set(got["k"]) == {-1, 0, 1, 2}
    want = expected.loc[list(zip(got["k"], got["start"], strict=True))].to_numpy()
    assert (got["n"].to_numpy() == want).all()
