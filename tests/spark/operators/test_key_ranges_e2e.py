"""End to end, key ranges (rule 15): a window whose fronts partition its keys emits a
range's windows once that range is complete, while a lagging front's range waits;
every window equals a batch recomputation, none is emitted twice, and a key whose
rows come from two ranges fails the query. With narrow steps (a ``where``, a ``map``)
between the generator and the window, each step's segment is split into the same
ranges, each row sent and received in its front's range at every step, under a task
failure after the acks were sent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.spark.operators.window_state import window_starts
from lowtide.spark.sinks.parquet import ParquetSink
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once, t0_of_checkpoint
from tests.spark.operators.changelogs import state_operators
from tests.spark.operators.helpers import GRID, STUCK_MS, all_input, read_results, start_slots

pytestmark = pytest.mark.spark

SIZE = 50  # slots: 500 ms windows


def batch_by(rows: pd.DataFrame, key: str) -> pd.DataFrame:
    """The batch recomputation: count and sum of ``seq`` per (key, window)."""
    starts = window_starts(rows["slot"].to_numpy(), SIZE, SIZE)[:, 0]
    return (rows.assign(start=starts).groupby([key, "start"])
            .agg(n=("seq", "size"), total=("seq", "sum")).reset_index())


@pytest.mark.slow  # ~31 s, the keyed runtime's ranges; by default on the driver:
# test_ranges_on_the_driver_under_failures_and_restarts
def test_a_range_is_emitted_before_a_lagging_range_and_all_equal_batch(
        spark, tmp_path: Path) -> None:
    # front 3 lags longer than a micro-batch on a loaded machine
    spec = GeneratorSpec(fronts=4, rate=160.0, payload_bytes=4, lag_ms={3: 20_000})
    pipe = lowtide.Pipeline(spark, "win-ranges", grid=GRID, stuck_after_ms=STUCK_MS)
    # a task of the window fails once after it sent its acks: its retry must not
    # emit a window twice nor early
    after = fail_once(lambda b, p: b % 4 == 2)
    stream = (pipe.generate(spec)
              .window("500 milliseconds", key="front", key_ranges=4, name="win")
              .agg(n="count", total=("seq", "sum"))
              .transform(lambda df: df.mapInArrow(after, df.schema)))
    graph = stream.graph()
    assert graph.ranges_of(graph.index("win")) == 4
    assert graph.fronts_of(graph.index("win")) == {f: {f} for f in range(4)}
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    query = stream.write_parquet(str(out), checkpoint=str(ckpt), trigger="200 milliseconds")
    try:
        t0 = t0_of_checkpoint(ckpt, query, timeout_s=240)
        query.wait_for_min_time(GRID.slot_of(t0) + 8 * SIZE, timeout_s=240)
        final = final_ahead_of_lagging(query, pipe, out, "front != 3")
    finally:
        query.stop()
        pipe.close()
    got = assert_equals_batch(out, "front", final,
                              lambda horizon: batch_by(all_input(spec, t0, horizon), "front"))
    assert {3} < set(got.index.get_level_values("front"))


def final_ahead_of_lagging(query: Any, pipe: Any, out: Path, fast: str) -> int:
    """The sink's min time, once :func:`assert_ahead_of_lagging` holds and nothing is
    stuck."""
    assert not query.stuck()
    assert_ahead_of_lagging(pipe.tracker.agent, out, fast)
    return int(query.min_time())


def assert_ahead_of_lagging(agent: Any, out: Path, fast: str) -> None:
    """Some window of a fast range (the rows ``fast`` selects) was written before the
    lagging range 3 was complete up to its end (when its result file was written)."""
    ahead = [int(e) for f in sorted(out.glob("*.parquet"))
             for e in start_slots(pq.read_table(f).to_pandas().query(fast)) + SIZE
             if e > agent.min_time_at("win#3", f.stat().st_mtime_ns // 1_000_000)]
    assert ahead, "no window of a fast range came out before the lagging range reached it"


def assert_equals_batch(out: Path, key: str, final: int,
                        batch: Callable[[int], pd.DataFrame]) -> pd.DataFrame:
    """The results in ``out``: each window once, equal to ``batch(horizon)``'s, and
    every window complete below ``final`` emitted; returns them by (key, start)."""
    results = read_results(out).assign(start=lambda d: start_slots(d))
    keys = list(zip(results[key], results["start"], strict=True))
    assert len(keys) == len(set(keys)), "a window was emitted twice"
    horizon = max(final, int(results["start"].max()) + SIZE)
    expected = batch(horizon).set_index([key, "start"])
    got = results.set_index([key, "start"]).sort_index()
    np.testing.assert_array_equal(got["n"], expected.loc[got.index, "n"])
    np.testing.assert_array_equal(got["total"], expected.loc[got.index, "total"])
    done = expected[expected.index.get_level_values("start") + SIZE <= final]
    assert set(done.index) <= set(got.index), "a complete window was not emitted"
    return got


def test_key_ranges_need_one_source_and_narrow_steps(spark, tmp_path: Path) -> None:
    pipe = lowtide.Pipeline(spark, "win-ranges-bad", grid=GRID)
    gen = pipe.generate(GeneratorSpec(fronts=2, rate=10.0))
    other = pipe.generate(GeneratorSpec(fronts=2, rate=10.0, first_front=2))
    two = gen.union(other).where("seq >= 0", name="keep")
    with pytest.raises(ValueError, match="'keep' is fed by gen:0-1, gen:2-3"):
        two.window("500 milliseconds", key="front", key_ranges=2, name="win").count().graph()
    keyed = gen.window("500 milliseconds", key="front", name="w1").count()
    with pytest.raises(ValueError, match=r"through narrow steps only .* 'win' is fed by w1"):
        keyed.window("1 second", key="front", key_ranges=2, name="win").count().graph()
    with pytest.raises(ValueError, match="needs the fronts of 'ingest' listed"):
        pipe.read_log(str(tmp_path / "log")).window(
            "500 milliseconds", key="front", key_ranges=2, name="win").count().graph()
    with pytest.raises(ValueError, match=r"front_ranges has no range for front\(s\) \[1\]"):
        gen.window("500 milliseconds", key="front", key_ranges=2, front_ranges={0: 1},
                   name="win").count().graph()
    with pytest.raises(ValueError, match="key_ranges=1"):
        gen.window("500 milliseconds", key="front", key_ranges=1)
    with pytest.raises(ValueError, match="front_ranges maps front ids"):
        gen.window("500 milliseconds", key="front", key_ranges=2, front_ranges={0: 2})
    pipe.close()


def test_a_key_in_two_ranges_fails_the_query(spark, tmp_path: Path) -> None:
    # seq 0, 1, ... comes from every front: each key is in every range
    pipe = lowtide.Pipeline(spark, "win-ranges-mixed", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = (pipe.generate(GeneratorSpec(fronts=2, rate=40.0))
              .window("500 milliseconds", key="seq", key_ranges=2, name="win").count())
    query = stream.write_parquet(str(tmp_path / "out"), checkpoint=str(tmp_path / "ckpt"),
                                 trigger="200 milliseconds")
    try:
        with pytest.raises(Exception, match="query failed"):
            query.wait_for_min_time(2**40, timeout_s=240)
        assert "has rows of key ranges [0, 1]" in str(query.query.exception())
    finally:
        query.stop()
        pipe.close()


# narrow steps between the source and the window: each segment split alike


def with_k(b: pa.RecordBatch) -> pa.RecordBatch:
    """Two keys per front: ``k = front * 10 + seq % 2`` (a key stays in its front's range)."""
    front = b["front"].to_numpy(zero_copy_only=False).astype(np.int64)
    seq = b["seq"].to_numpy(zero_copy_only=False)
    return pa.RecordBatch.from_arrays([b["front"], b["seq"], pa.array(front * 10 + seq % 2)],
                                      names=["front", "seq", "k"])


def batch_windows(rows: pd.DataFrame) -> pd.DataFrame:
    return by_k(rows[rows["seq"] % 3 != 0])


@pytest.mark.slow  # ~30 s; key ranges e2e by default: test_ranges_on_the_driver_...
def test_ranges_through_where_and_map_emit_early_and_equal_batch(spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=4, rate=160.0, payload_bytes=4, lag_ms={3: 20_000})
    pipe = lowtide.Pipeline(spark, "win-ranges-steps", grid=GRID, stuck_after_ms=STUCK_MS)
    # a task of the where fails once after it sent its acks (the next step is in its
    # task): its retry must send the same acks in the same ranges
    after = fail_once(lambda b, p: b % 4 == 2)
    stream = (pipe.generate(spec)
              .where("seq % 3 != 0", name="keep")
              .transform(lambda df: df.mapInArrow(after, df.schema))
              .map(with_k, "front int, seq long, k long", name="addk")
              .window("500 milliseconds", key="k", key_ranges=4, name="win")
              .agg(n="count", total=("seq", "sum")))
    graph = stream.graph()
    assert [graph.ranges_of(graph.index(s)) for s in ("keep", "addk", "win")] == [4, 4, 4]
    assert graph.fronts_of(graph.index("keep")) == {f: {f} for f in range(4)}
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    query = stream.write_parquet(str(out), checkpoint=str(ckpt), trigger="200 milliseconds")
    try:
        t0 = t0_of_checkpoint(ckpt, query, timeout_s=240)
        query.wait_for_min_time(GRID.slot_of(t0) + 8 * SIZE, timeout_s=240)
        assert not query.stuck()
        agent = pipe.tracker.agent
        assert_ahead_of_lagging(agent, out, "k // 10 != 3")
        final = query.min_time()
        doc = agent.status()  # what `lowtide status`, the metrics and the web view show
    finally:
        query.stop()
        pipe.close()
    ranged = {s["segment"]: s["key_ranges"] for s in doc["segments"] if s.get("key_ranges")}
    assert set(ranged) == {"keep", "addk", "win"} and len(ranged["keep"]) == 4
    assert min(ranged["win"][:3]) > ranged["win"][3], "the lagging range is not the lowest"
    assert_equals_batch(out, "k", final,
                        lambda horizon: batch_windows(all_input(spec, t0, horizon)))


def test_a_step_that_drops_the_front_is_refused_where_described(spark, tmp_path: Path) -> None:
    pipe = lowtide.Pipeline(spark, "win-ranges-dropped", grid=GRID)
    gen = pipe.generate(GeneratorSpec(fronts=2, rate=10.0))
    dropped = (gen.select("seq").where("seq >= 0", name="keep")
               .window("500 milliseconds", key="seq", key_ranges=2, name="win").count())
    with pytest.raises(ValueError, match="step 'keep': its rows are split into key ranges"):
        dropped.write_parquet(str(tmp_path / "a"), checkpoint=str(tmp_path / "ca"))
    pipe.close()


def by_k(rows: pd.DataFrame) -> pd.DataFrame:
    """:func:`batch_by` key ``k`` (as :func:`with_k` makes it)."""
    return batch_by(rows.assign(k=lambda d: d["front"] * 10 + d["seq"] % 2), "k")


def by_k_windows(pipe: Any, spec: GeneratorSpec, before: Callable[[Any], Any] | None = None
                 ) -> Any:
    """Per-``k`` 500 ms windows (count, sum of ``seq``) with 4 key ranges, ``before``
    (a DataFrame transform) between the keys' map and the window."""
    keyed = pipe.generate(spec).map(with_k, "front int, seq long, k long", name="addk")
    keyed = keyed if before is None else keyed.transform(before)
    return (keyed.window("500 milliseconds", key="k", key_ranges=4, name="win")
            .agg(n="count", total=("seq", "sum")))


def parquet_runs(stream: Any, tmp_path: Path) -> tuple[Path, Path, Callable[[], Any]]:
    """(the output folder, the checkpoint, a function that starts ``stream`` into them)."""
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    return out, ckpt, lambda: stream.write_parquet(str(out), checkpoint=str(ckpt),
                                                   trigger="200 milliseconds")


def assert_by_k_equals_batch(out: Path, final: int, spec: GeneratorSpec, t0: int) -> None:
    got = assert_equals_batch(out, "k", final,
                              lambda horizon: by_k(all_input(spec, t0, horizon)))
    assert {30, 31} < set(got.index.get_level_values("k"))  # the lagging front's too


@pytest.mark.slow  # ~17 s; key ranges e2e by default: test_ranges_on_the_driver_...
def test_buckets_of_mixed_ranges_survive_a_task_failure_and_a_restart(
        spark, tmp_path: Path) -> None:
    # two keys per front, 8 keys in 2 buckets (one per shuffle partition): each bucket
    # holds keys of several ranges, the lagging front's among them
    spec = GeneratorSpec(fronts=4, rate=160.0, payload_bytes=4, lag_ms={3: 3_000})
    pipe = lowtide.Pipeline(spark, "win-ranges-restart", grid=GRID, stuck_after_ms=STUCK_MS)
    after = fail_once(lambda b, p: b % 4 == 2)  # the window's task, after its acks
    stream = by_k_windows(pipe, spec).transform(lambda df: df.mapInArrow(after, df.schema))
    out, ckpt, start = parquet_runs(stream, tmp_path)
    query = start()
    try:
        t0 = t0_of_checkpoint(ckpt, query, timeout_s=240)
        query.wait_for_min_time(GRID.slot_of(t0) + 2 * SIZE, timeout_s=240)
        query.stop()  # every range has windows pending in the buckets' state
        query = start()
        query.wait_for_min_time(query.min_time() + 6 * SIZE, timeout_s=240)
        final = final_ahead_of_lagging(query, pipe, out, "k // 10 != 3")
    finally:
        query.stop()
        pipe.close()
    assert_by_k_equals_batch(out, final, spec, t0)


# the window as the query's last step: Spark aggregates, the driver emits each range's
# windows (the tests above end in a transform: the keyed runtime)


def test_ranges_on_the_driver_under_failures_and_restarts(
        spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key-range window as the query's last step (:mod:`lowtide.spark.operators.
    window_driver`): Spark's aggregation is its one state operator, the driver emits
    each range's windows once that range is complete. A sender task fails once; the
    Parquet sink fails once after the driver sent a batch's acks, and the query is
    started again from its checkpoint, with windows of every range open. A fast
    range's windows come out before the lagging range reaches them, each window once,
    all equal to the batch recomputation."""
    spec = GeneratorSpec(fronts=4, rate=160.0, payload_bytes=4, lag_ms={3: 2_000})
    pipe = lowtide.Pipeline(spark, "win-ranges-driver", grid=GRID, stuck_after_ms=STUCK_MS)
    before = fail_once(lambda b, p: b % 5 == 3 and p == 0)  # a sender's task
    stream = by_k_windows(pipe, spec, lambda df: df.mapInArrow(before, df.schema))
    publish, failed = ParquetSink._publish, []

    def fails_once(self: Any, staged: Any, query: str, batch_id: int, digest: str) -> None:
        if batch_id >= 8 and not failed:  # after the driver step's acks
            failed.append(batch_id)
            raise RuntimeError("injected sink failure")
        publish(self, staged, query, batch_id, digest)

    monkeypatch.setattr(ParquetSink, "_publish", fails_once)
    out, ckpt, start = parquet_runs(stream, tmp_path)
    query = start()
    try:
        t0 = t0_of_checkpoint(ckpt, query, timeout_s=240)
        with pytest.raises(Exception, match="injected sink failure"):
            query.awaitTermination(timeout=300)
        query = start()  # every range had windows open in the driver's state
        query.wait_for_min_time(GRID.slot_of(t0 + 2_000) + 4 * SIZE, timeout_s=240)
        query.wait_for_min_time(query.min_time() + SIZE, timeout_s=240)  # a batch's progress
        assert len(state_operators(query)) == 1, state_operators(query)
        final = final_ahead_of_lagging(query, pipe, out, "k // 10 != 3")
    finally:
        query.stop()
        pipe.close()
    assert failed and (ckpt / "lowtide" / "changelog-win").is_dir()
    assert_by_k_equals_batch(out, final, spec, t0)
