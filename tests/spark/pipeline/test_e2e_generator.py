"""End to end, generator source: the sink's min time passes t only after every row
with time < t is committed, with a lagging front, injected task failures and an
untracked filter that drops rows."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.core.time import TimeGrid
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import Watcher, fail_once, gen_expected, wait_batches

pytestmark = pytest.mark.spark

GRID = TimeGrid(delta_ms=10)


def enrich(b: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch(
        {"front": b["front"], "seq": b["seq"], "event_ms": b["event_ms"],
         "x": pc.multiply(b["seq"], 2)}
    )


def explode(b: pa.RecordBatch):
    seq = b["seq"].to_numpy()
    reps = (seq % 3).astype(np.int64)
    parents = np.repeat(np.arange(len(seq)), reps)
    k = np.arange(len(parents)) - np.repeat(np.cumsum(reps) - reps, reps)
    out = pa.record_batch({
        "front": b["front"].take(pa.array(parents)),
        "seq": pa.array(seq[parents]),
        "event_ms": b["event_ms"].take(pa.array(parents)),
        "k": pa.array(k.astype(np.int64)),
    })
    return out, parents


def keep(b: pa.RecordBatch):
    return pc.equal(pc.bit_wise_and(pc.add(b["seq"], b["k"]), 1), 0)


def expected_children(front: int, seq: int) -> list[tuple[int, int, int]]:
    return [(front, seq, k) for k in range(seq % 3) if (seq + k) % 2 == 0]


def t0_of(spec: GeneratorSpec, front: int, seq: int, event_ms: int) -> int:
    return int(event_ms - np.floor(seq * (1000.0 / spec.rate_of(front))))


def check_notifications(spec, seen, committed, delta_ms) -> int:
    """Every notified t: all rows with slot < t were in the sink's committed prefix."""
    keys = [(f, s, k) for f, s, k, _e in committed]
    assert len(keys) == len(set(keys)), "the sink received duplicates"
    f, s, _k, e = committed[0]
    t0 = t0_of(spec, f, s, e)
    checked = 0
    for n in seen:
        if n.time <= GRID.slot_of(t0):
            continue
        have = set(keys[: n.snapshot])
        for front, rows in gen_expected(spec, t0, n.time, delta_ms).items():
            for seq in range(rows):
                for key in expected_children(front, seq):
                    assert key in have, f"premature: t={n.time} but {key} not committed"
                    checked += 1
    return checked


def test_lagging_front_exact_completeness(spark, tmp_path: Path) -> None:
    lag = 400
    spec = GeneratorSpec(fronts=3, rate=300.0, payload_bytes=4, lag_ms={2: lag})
    committed: list[tuple[int, int, int, int]] = []
    lock = threading.Lock()

    def sink(df, batch_id):  # type: ignore[no-untyped-def]
        rows = df.select("front", "seq", "k", "event_ms").collect()
        with lock:
            committed.extend(tuple(r) for r in rows)

    pipe = lowtide.Pipeline(spark, "lagging", grid=GRID)
    stream = (
        pipe.generate(spec)
        .map(enrich, "front int, seq long, event_ms long, x long", name="enrich")
        .repartition(2)
        .flat_map(explode, "front int, seq long, event_ms long, k long", name="explode")
        .filter(keep, name="keep")
    )
    assert stream.segment_names() == ["enrich", "explode", "keep", "sink"]
    watcher = query = None
    try:
        query = stream.foreach_batch(
            sink, checkpoint=str(tmp_path / "ckpt"), trigger="100 milliseconds"
        )
        watcher = Watcher(pipe.tracker.agent, "sink", lambda: len(committed)).start()
        watcher.wait_for(1, 60, query.query)
        start = watcher.latest()
        watcher.wait_for(start + 200, 90, query.query)  # two seconds of rows complete
        pipe.status()
        time.sleep(1.0)
        status = pipe.status()
        assert [s.segment for s in status.segments] == ["enrich", "explode", "keep", "sink"]
        assert not status.stuck
        by_name = {s.segment: s for s in status.segments}
        assert by_name["enrich"].rows_per_s and by_name["enrich"].rows_per_s > 0
        assert by_name["sink"].lag_ms is not None and by_name["sink"].lag_ms >= lag
        assert "rows/s" in status.render(GRID.delta_ms)
    finally:
        if query is not None:
            query.stop()
        if watcher is not None:
            watcher.stop()
        pipe.close()
    with lock:
        rows = list(committed)
    assert check_notifications(spec, watcher.seen, rows, GRID.delta_ms) > 100
    # the lagging front holds completeness back by its lag (once its rows flow)
    f, s, _k, e = rows[0]
    t0 = t0_of(spec, f, s, e)
    for n in watcher.seen:
        assert n.time * GRID.delta_ms <= max(t0, n.wall_ms - lag)
    assert watcher.latest() * GRID.delta_ms > t0 + 1_000


def tag(b: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch({"front": b["front"], "seq": b["seq"], "event_ms": b["event_ms"],
                            "tag": pc.bit_wise_and(b["seq"], 7)})


def published(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("part-*.parquet"))


# ~10 s each: "grouped" in the slow tier
@pytest.mark.parametrize("fronts,tasks", [(2, 0), pytest.param(4, 2, marks=pytest.mark.slow)],
                         ids=["task per front", "grouped"])
def test_task_failures_no_premature_no_stuck(spark, tmp_path: Path, fronts: int,
                                             tasks: int) -> None:
    """Tasks fail after the tracked operator sent its acks (retried with the same
    key) and inside the sink's write tasks (nothing acked before commit). Grouped:
    two fronts per source task (``tasks=2``), the first failure in such a task."""
    spec = GeneratorSpec(fronts=fronts, rate=200.0, payload_bytes=0, tasks=tasks)
    out = tmp_path / "out"
    pipe = lowtide.Pipeline(spark, "failures", grid=GRID)
    stream = (
        pipe.generate(spec)
        .map(enrich, "front int, seq long, event_ms long, x long", name="enrich")
        .transform(lambda df: df.mapInArrow(fail_once(lambda b, p: b % 3 == 1 and p == 0),
                                            df.schema))
        .repartition(2)
        .map(tag, "front int, seq long, event_ms long, tag long", name="tag")
        .transform(lambda df: df.mapInArrow(fail_once(lambda b, p: b % 3 == 2 and p == 1),
                                            df.schema))
    )
    watcher = query = None
    try:
        query = stream.write_parquet(str(out), checkpoint=str(tmp_path / "ckpt"),
                                     trigger="100 milliseconds", keep_tracking_columns=True)
        watcher = Watcher(pipe.tracker.agent, "sink", lambda: published(out)).start()
        wait_batches(query.query, 5, 90)  # failures are injected into batches 1, 2, 4, 5
        watcher.wait_for(GRID.slot_of(time.time_ns() // 1_000_000) - 30, 60, query.query)
        assert not pipe.status().stuck
    finally:
        if query is not None:
            query.stop()
        if watcher is not None:
            watcher.stop()
        pipe.close()
    files = {name: pq.read_table(out / name, columns=["front", "seq", "event_ms", "lt_time"])
             for name in published(out)}
    table = pa.concat_tables(files.values())
    keys = list(zip(table["front"].to_pylist(), table["seq"].to_pylist(), strict=True))
    assert len(keys) == len(set(keys)), "duplicates at the sink"
    t0 = t0_of(spec, keys[0][0], keys[0][1], table["event_ms"][0].as_py())
    checked = 0
    for n in watcher.seen:
        if n.time <= GRID.slot_of(t0):
            continue
        have: set[tuple[int, int]] = set()
        for name in n.snapshot:
            t = files[name]
            have.update(zip(t["front"].to_pylist(), t["seq"].to_pylist(), strict=True))
        for front, rows in gen_expected(spec, t0, n.time, GRID.delta_ms).items():
            missing = [s for s in range(rows) if (front, s) not in have]
            assert not missing, f"premature: t={n.time}, front {front} rows {missing[:5]}"
            checked += rows
    assert checked > 100


def drop_some(df):  # an untracked filter: NOT 1:1, so the tracker must report it
    return df.filter("seq % 5 != 3")


def test_untracked_filter_loss_is_named(spark, tmp_path: Path) -> None:
    import re

    spec = GeneratorSpec(fronts=3, rate=150.0, payload_bytes=0, stall={2: (1_500, None)})
    pipe = lowtide.Pipeline(spark, "loss", grid=GRID, stuck_after_ms=1_500)
    stream = (
        pipe.generate(spec)
        .map(enrich, "front int, seq long, event_ms long, x long", name="a")
        .transform(drop_some)
        .map(tag, "front int, seq long, event_ms long, tag long", name="b")
    )
    events: list[tuple[int, int, int]] = []

    def sink(df, batch_id):  # type: ignore[no-untyped-def]
        events.extend(tuple(r) for r in df.select("front", "seq", "event_ms").collect())

    query = None
    try:
        query = stream.foreach_batch(sink, checkpoint=str(tmp_path / "ckpt"),
                                     trigger="100 milliseconds")
        deadline = time.monotonic() + 90
        status = pipe.status()
        while not (status.stuck and status.stalled_fronts):
            assert query.query.exception() is None, query.query.exception()
            assert time.monotonic() < deadline, f"no loss reported: {status.render(10)}"
            time.sleep(0.2)
            status = pipe.status()
        # a loss stays; a window that is merely slow (a loaded machine) goes away
        time.sleep(2.0)
        again = pipe.status()
        lasting = [ln for ln in again.stuck if ln in status.stuck]
        text = again.render(GRID.delta_ms)
    finally:
        if query is not None:
            query.stop()
        pipe.close()
    assert again.stalled_fronts == [2] and "STALLED" in text
    assert "STUCK" in text
    f, s, e = events[0]
    t0 = t0_of(spec, f, s, e)
    lines = [ln for ln in lasting if ln.startswith("segment 'b'")]
    assert lines, (status.stuck, again.stuck)  # sent into b by a, never received by b
    for line in lines:
        m = re.match(r"segment '(\w+)', slots \[(\d+), (\d+)\): (\d+) item\(s\) missing", line)
        assert m, line
        lo, hi, count = int(m.group(2)), int(m.group(3)), int(m.group(4))
        dropped = 0
        for front in spec.front_ids():
            seq = np.arange(0, 10_000)
            slots = (t0 + np.floor(seq * (1000.0 / spec.rate_of(front)))).astype(np.int64) // 10
            dropped += int(((slots >= lo) & (slots < hi) & (seq % 5 == 3)).sum())
        assert count == dropped


@pytest.mark.slow  # ~12 s; by default a secret: service/test_auth.py, a served tracker:
# operators/test_hold_wait_e2e.py
def test_remote_tracker_with_secret(spark, tmp_path: Path) -> None:
    """A standalone tracker (the real service, started bare) adopts the pipeline's
    graph from the handshake; the executors authenticate with the shared secret.
    Front 1 is idle (one row, then nothing): its heartbeats keep completeness going."""
    from lowtide.service import TrackerService

    secret = "remote-secret-" + "x" * 32
    svc = TrackerService.start(None, grid=GRID, secret=secret.encode())
    pipe = lowtide.Pipeline(spark, "remote", tracker=svc.url, secret=secret, grid=GRID)
    query = None
    try:
        stream = pipe.generate(fronts=2, rate=100.0, skew=60.0).map(
            enrich, "front int, seq long, event_ms long, x long", name="enrich")
        query = stream.to_null(checkpoint=str(tmp_path / "ckpt"), trigger="100 milliseconds")
        assert pipe.tracker.service is None  # nothing embedded
        now = GRID.slot_of(time.time_ns() // 1_000_000)
        assert query.wait_for_min_time(now, timeout_s=90) >= now
        status = svc.status()
        assert [s["segment"] for s in status["segments"]] == ["enrich", "sink"]
        assert set(status["fronts"]) == {"0", "1"}
    finally:
        if query is not None:
            query.stop()
        pipe.close()
        svc.stop()
