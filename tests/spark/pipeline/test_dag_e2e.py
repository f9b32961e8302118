"""End to end, DAG shapes: two sources with a lagging front and injected task
failures, unioned into an exact window, equal a batch recomputation of the same
events; two sinks on one tracker are both complete when announced; a second query
attached to a running pipeline's tracker, then detached (rule 16); a second query of
one ingest log attached while its fronts run on."""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import lowtide
from lowtide.spark.sources.generator import GeneratorSpec
from lowtide.spark.sources.ingest import IngestReader
from tests.spark.helpers import fail_once, gen_expected
from tests.spark.operators.helpers import (
    AGG_COLS,
    GRID,
    STUCK_MS,
    all_input,
    batch_windows,
    check,
    parse,
    read_results,
    start_slots,
)

pytestmark = pytest.mark.spark

SCHEMA = "front int, seq long, user string, amount double"


def test_two_sources_union_window_equals_batch(spark, tmp_path: Path) -> None:
    """With a lagging front and injected task failures: in one branch before the union
    (after its tracked map sent its acks) and after the window."""
    t0 = int(time.time() * 1000)  # one t0 for both sources, for the recomputation
    a = GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4, lag_ms={1: 1500}, t0_ms=t0)
    b = GeneratorSpec(fronts=1, first_front=2, rate=150.0, payload_bytes=4, t0_ms=t0)
    pipe = lowtide.Pipeline(spark, "union", grid=GRID, stuck_after_ms=STUCK_MS)
    before = fail_once(lambda bid, p: bid % 5 == 3 and p == 0)
    after = fail_once(lambda bid, p: bid % 4 == 2)
    stream = (pipe.generate(a).map(parse, SCHEMA, name="pa")
              .transform(lambda df: df.mapInArrow(before, df.schema))
              .union(pipe.generate(b).map(parse, SCHEMA, name="pb"))
              .window("1 second", key="user", name="win")
              .agg(n="count", total=("amount", "sum"), lo=("amount", "min"),
                   hi=("amount", "max"), avg=("amount", "mean"))
              .transform(lambda df: df.mapInArrow(after, df.schema)))
    assert stream.segment_names() == ["pa", "pb", "win", "win.state", "sink"]
    try:
        query = stream.write_parquet(str(tmp_path / "out"), checkpoint=str(tmp_path / "ckpt"),
                                     trigger="200 milliseconds")
        query.wait_for_min_time(GRID.slot_of(t0) + 400, timeout_s=120)
        assert not query.stuck()
        query.stop()
        final = query.min_time()
    finally:
        pipe.close()
    results = read_results(tmp_path / "out")
    horizon = max(final, int(start_slots(results).max()) + 100)
    rows = pd.concat([all_input(a, t0, horizon), all_input(b, t0, horizon)])
    expected = batch_windows(rows, 100, 100)
    check(results, expected, horizon, 100, AGG_COLS)
    got = set(zip(results["user"], start_slots(results), strict=True))
    done = expected[expected["start"] + 100 <= final]
    assert set(zip(done["user"], done["start"], strict=True)) <= got
    assert done["fronts"].max() == 3  # windows hold rows of both sources
    assert len(done) >= 4


def test_union_of_different_columns_names_them(spark, tmp_path: Path) -> None:
    pipe = lowtide.Pipeline(spark, "union-cols", grid=GRID)
    a = pipe.generate(fronts=1).map(parse, SCHEMA, name="pa")
    b = pipe.generate(fronts=1, first_front=1).map(parse, "front int, seq long", name="pb")
    try:
        with pytest.raises(ValueError, match=r"^union: input 1 and input 2 differ in "
                           r"columns: amount double vs -; user string vs -$"):
            a.union(b).to_null(checkpoint=str(tmp_path / "ckpt"))
    finally:
        pipe.close()


def test_two_sinks_on_one_tracker_both_complete(spark, tmp_path: Path) -> None:
    t0 = int(time.time() * 1000)
    specs = {"out_a": GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4,
                                    lag_ms={1: 1000}, t0_ms=t0),
             "out_b": GeneratorSpec(fronts=1, first_front=2, rate=100.0, payload_bytes=4,
                                    t0_ms=t0)}
    pipe = lowtide.Pipeline(spark, "two-sinks", grid=GRID, stuck_after_ms=STUCK_MS)
    streams = {name: pipe.generate(spec).map(parse, SCHEMA, name=f"p_{name}")
               for name, spec in specs.items()}
    pipe.start_tracker(pipe.plan(*[(s, name) for name, s in streams.items()]).graph)
    seen: dict[str, list[tuple[int, int]]] = {name: [] for name in specs}

    def writer(name: str):  # type: ignore[no-untyped-def]
        def write(df, batch_id):  # type: ignore[no-untyped-def]
            seen[name].extend((r.front, r.seq) for r in df.select("front", "seq").collect())
        return write

    t = GRID.slot_of(t0) + 200
    try:
        queries = {name: s.foreach_batch(writer(name), name=name, trigger="200 milliseconds",
                                         checkpoint=str(tmp_path / name))
                   for name, s in streams.items()}
        for name, q in queries.items():
            q.wait_for_min_time(t, timeout_s=120)
            committed = set(seen[name])  # what the sink had when completeness was announced
            expected = gen_expected(specs[name], t0, t, GRID.delta_ms)
            for front, n in expected.items():
                assert n > 0 and {(front, s) for s in range(n)} <= committed
            assert not q.stuck()
    finally:
        pipe.close()


@pytest.mark.slow  # ~16 s; a second query of a running log by default: test_two_consumers_spark.py
def test_a_second_query_attaches_while_the_first_runs(spark, tmp_path: Path) -> None:
    """A graph that changes while it runs (rule 16): a second query started on a
    running pipeline attaches its segments to the pipeline's tracker while the first
    keeps running; its exact windows equal a batch recomputation of its input;
    detached again, the first runs on alone, and its min time never went back."""
    first = GeneratorSpec(fronts=1, rate=150.0, payload_bytes=4)
    pipe = lowtide.Pipeline(spark, "attach", grid=GRID, stuck_after_ms=STUCK_MS)
    seen: list[int] = []
    try:
        q1 = (pipe.generate(first).map(parse, SCHEMA, name="p1")
              .to_null(checkpoint=str(tmp_path / "ckpt1"), name="sink1",
                       trigger="200 milliseconds"))
        q1.wait_for_min_time(GRID.slot_of(int(time.time() * 1000)), timeout_s=120)
        seen.append(q1.min_time())
        # its rows start after it attached: a query reading from before the global min
        # time would be refused (rule 16)
        t0 = int(time.time() * 1000) + 5_000
        second = GeneratorSpec(fronts=2, first_front=1, rate=200.0, payload_bytes=4,
                               lag_ms={2: 600}, t0_ms=t0)
        stream = (pipe.generate(second).map(parse, SCHEMA, name="p2")
                  .window("1 second", key="user", name="win2")
                  .agg(n="count", total=("amount", "sum"), lo=("amount", "min"),
                       hi=("amount", "max"), avg=("amount", "mean")))
        q2 = stream.write_parquet(str(tmp_path / "out"), checkpoint=str(tmp_path / "ckpt2"),
                                  name="sink2", trigger="200 milliseconds")
        assert pipe.tracker.graph.names[:2] == ("p1", "sink1")  # generation 0 kept its indices
        assert pipe.tracker.status()["generation"] == 1
        q2.wait_for_min_time(GRID.slot_of(t0) + 400, timeout_s=180)
        seen.append(q1.min_time())
        assert q1.isActive and not q2.stuck() and not q1.stuck()
        final = q2.min_time()
        reports = pipe.detach(q2)                 # stopped, its segments detached
        assert pipe.tracker.status()["generation"] == 2
        assert [r.split("'")[1] for r in reports] == ["p2", "win2", "win2.state", "sink2"]
        assert pipe.tracker.graph.detached == (2, 3, 4, 5)
        before = q1.min_time()
        q1.wait_for_min_time(before + 50, timeout_s=60)  # the first runs on, alone
        seen.append(q1.min_time())
    finally:
        pipe.close()
    assert seen == sorted(seen) and seen[-1] > seen[0]  # the first query kept moving
    results = read_results(tmp_path / "out")
    horizon = max(final, int(start_slots(results).max()) + 100)
    expected = batch_windows(pd.concat([all_input(second, t0, horizon)]), 100, 100)
    check(results, expected, horizon, 100, AGG_COLS)
    done = expected[expected["start"] + 100 <= final]
    got = set(zip(results["user"], start_slots(results), strict=True))
    assert len(done) >= 4 and set(zip(done["user"], done["start"], strict=True)) <= got


@pytest.mark.slow  # ~35 s; a second query of a running log by default: test_two_consumers_spark.py
def test_a_second_query_of_a_log_joins_its_running_fronts(spark, tmp_path: Path) -> None:
    """Issue 34, point 5: a second query reading the same log attached while its fronts
    keep running (no restart): each front joins it between two batches and answers the
    offset it starts from; its exact windows equal a batch recomputation of the rows
    from there (each front's rows at or after the time it joined), and the first query
    runs on."""
    ingest = tmp_path / "ingest"
    window_ms = 200
    pipe = lowtide.Pipeline(spark, "join", grid=GRID, stuck_after_ms=STUCK_MS)

    def counts(name: str) -> Any:
        return (pipe.read_log(str(ingest), name=f"ingest_{name}", fronts=[0, 1])
                .selectExpr("CAST(payload AS STRING) AS user")
                .window(f"{window_ms} milliseconds", key="user", name=f"w_{name}")
                .agg(n="count"))

    stop = threading.Event()
    try:
        q1 = counts("a").write_parquet(str(tmp_path / "out_a"), checkpoint=str(tmp_path / "ca"),
                                       name="sink_a", trigger="200 milliseconds")
        fronts = [pipe.front(f, fsync="never", heartbeat_ms=10) for f in (0, 1)]
        producer = threading.Thread(target=produce, args=(fronts, stop), daemon=True)
        producer.start()
        q1.wait_for_min_time(GRID.slot_of(int(time.time() * 1000)), timeout_s=120)
        q2 = counts("b").write_parquet(str(tmp_path / "out_b"), checkpoint=str(tmp_path / "cb"),
                                       name="sink_b", trigger="200 milliseconds")
        deadline = time.monotonic() + 120  # each front joins it between two batches
        while not all(f.segments == ("ingest_a", "ingest_b") for f in fronts):
            assert time.monotonic() < deadline, [f.segments for f in fronts]
            time.sleep(0.05)
        joined = max(f.status()["max_label"] for f in fronts)
        q2.wait_for_min_time(joined + 200, timeout_s=180)
        assert q1.isActive and not q1.stuck() and not q2.stuck()
        stop.set()
        producer.join()
        q2.stop()
        final = q2.min_time()
    finally:
        stop.set()
        pipe.close()
    rows = []
    for f in (0, 1):
        join = json.loads((ingest / "joins" / "ingest_b" / f"f{f}.json").read_text())
        reader = IngestReader(ingest, f)
        times, payload = reader.read(join["offset"], reader.end_offset())
        assert join["offset"] > 0 and int(times.min()) >= join["time"]  # it joined late
        before, _p = reader.read(join["offset"] - 1, join["offset"])
        assert int(before[0]) < join["time"]  # the records before are not its
        rows.append(pd.DataFrame({"user": [p.decode() for p in payload.to_pylist()],
                                  "slot": times}))
    size = window_ms // GRID.delta_ms
    batch = pd.concat(rows)
    expected = (batch.assign(start=batch["slot"] // size * size)
                .groupby(["user", "start"]).size().rename("n").reset_index())
    results = read_results(tmp_path / "out_b")
    got = set(zip(results["user"], start_slots(results), results["n"], strict=True))
    done = expected[expected["start"] + size <= final]
    want = set(zip(expected["user"], expected["start"], expected["n"], strict=True))
    assert got <= want  # every window it wrote holds exactly the rows of the batch
    assert len(done) >= 6
    assert set(zip(done["user"], done["start"], done["n"], strict=True)) <= got


def produce(fronts: list[lowtide.Front], stop: threading.Event) -> None:
    """Two records per front every ~10 ms, until ``stop``."""
    for i in itertools.count():
        if stop.is_set():
            return
        for f in fronts:
            f.send([f"u{(i + f.front) % 3}".encode()] * 2)
        time.sleep(0.01)
