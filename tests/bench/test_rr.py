"""``lowtide bench rr``: punctuation alignment (pure, then in Spark), the harness in a
tiny mode whose counts must add up, and the figures."""

from __future__ import annotations

import doctest
import tempfile
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from lowtide.bench import rr, rr_report
from lowtide.bench.punctuations import (
    EPOCH_COL,
    MARK_COL,
    ROUTE_COL,
    Aligner,
    MisalignedMarker,
    Routing,
    inject,
    stage,
)
from lowtide.bench.spark import BenchConfig, user_map

P = 2
ROUTING = Routing((10, 11))  # route key 10 -> partition 0, 11 -> partition 1


def front_rows(front: int, start: int, n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "front": pa.array([front] * n, pa.int32()),
        "seq": pa.array(range(start, start + n), pa.int64()),
        "event_ms": pa.array([0] * n, pa.int64()),
        "payload": pa.array([b"x"] * n),
    })


def shuffle(outputs: list[list[pa.RecordBatch]]) -> list[list[pa.RecordBatch]]:
    """Route every row by its route key, interleaving the upstream partitions."""
    parts: list[list[pa.RecordBatch]] = [[] for _ in range(P)]
    for batches in reversed(outputs):  # arrival order must not matter
        for b in batches:
            route = b.column(b.schema.get_field_index(ROUTE_COL)).to_numpy()
            for j, key in enumerate(ROUTING.keys):
                part = b.filter(pa.array(route == key))
                if part.num_rows:
                    parts[j].append(part)
    return parts


def markers_of(batches: list[pa.RecordBatch]) -> list[tuple[int, int]]:
    out = []
    for b in batches:
        mark = b.column(b.schema.get_field_index(MARK_COL)).to_pylist()
        fronts = b.column(0).to_pylist()
        epochs = b.column(b.schema.get_field_index(EPOCH_COL)).to_pylist()
        out += [(f, e) for m, f, e in zip(mark, fronts, epochs, strict=True) if m]
    return out


def run_stages(sources: list[pa.RecordBatch], g: int, n: int) -> list[list[pa.RecordBatch]]:
    """RR-n by hand: per last-stage partition, its output batches in order."""
    outs = []
    for f, rows in enumerate(sources):
        data, markers = inject(rows, g, ROUTING, f, 1)
        outs.append([data, markers])
    for k in range(n):
        ins = shuffle(outs)
        expected = 1 if k == 0 else P
        outs = [list(stage(ins[j], user_map, Aligner(expected, ROUTING.keys[j]), g, ROUTING, j,
                           k == n - 1)) for j in range(P)]
    return outs


def test_each_marker_reaches_the_sink_once_after_all_its_copies() -> None:
    g, n = 3, 3
    parts = run_stages([front_rows(0, 0, 10), front_rows(1, 0, 7)], g, n)
    sink = [b for part in parts for b in part]
    got = markers_of(sink)
    want = [(0, e) for e in range(10 // g)] + [(1, e) for e in range(7 // g)]
    # one copy from each last-stage partition: aligned at the sink with P copies each
    assert sorted(got) == sorted(want * P)
    data_rows = sum(b.num_rows for b in sink) - len(got)
    assert data_rows == 17
    for part in parts:  # a task's markers follow all of its data rows
        mark = [m for b in part for m in b.column(b.schema.get_field_index(MARK_COL)).to_pylist()]
        assert mark == sorted(mark)


def test_a_missing_copy_is_refused_not_forwarded() -> None:
    _data, markers = inject(front_rows(0, 0, 4), 2, ROUTING, 0, 1)
    own = markers.filter(pa.array(np.asarray(markers.column(ROUTE_COL)) == ROUTING.keys[0]))
    aligner = Aligner(expected=P, own_key=ROUTING.keys[0])
    with pytest.raises(MisalignedMarker):
        list(stage([own], user_map, aligner, 2, ROUTING, 0, False))
    with pytest.raises(MisalignedMarker):  # a copy routed to the other partition
        Aligner(1, ROUTING.keys[1]).add(own)


def test_docstring_examples() -> None:
    from lowtide.bench import punctuations

    result = doctest.testmod(punctuations)
    assert result.attempted > 0 and result.failed == 0


def synthetic_result() -> dict[str, Any]:
    cfg = rr.RRConfig(sizes=(3, 10), granularities=(10,))
    samples = []
    for n in cfg.sizes:
        for mode in cfg.modes():
            s = rr.Sample(mode, n, 1000, 1.0, 2, 1.0, 1000.0, rows_total=2000,
                          after_last_row_ms=(5.0,), batch_ms=500.0)
            if mode in rr.TRACKER_MODES or mode == rr.NO_LOCAL:
                s.messages = s.expected_messages = 20
            if mode.startswith("punctuations"):
                s.marker_rows, s.markers = [400, 800, 400], 200
            samples.append((0, s))
    return rr.summarize(cfg, samples, {"100": "too slow"})


def test_figures_build_from_a_result() -> None:
    result = synthetic_result()
    names = [f.name for f in rr_report.figures(result)]
    assert names[:3] == ["throughput_overhead", "traffic_by_granularity_spark",
                         "notification_latency_spark"]
    assert "throughput_by_graph_size_spark" in names
    no_local = next(r for r in result["results"] if r["mode"] == rr.NO_LOCAL and r["stages"] == 3)
    assert no_local["messages_per_50k"] == 50_000 * (2 * 3 + 2)
    assert "RR-100 skipped" in rr_report.figures(result)[0].note


def test_a_failing_point_is_reported_and_the_others_still_run(monkeypatch) -> None:
    """RR-100's punctuations ran out of heap once and took 25 minutes of results with
    them: now a failed point is named in the result and the run goes on."""
    import lowtide.bench.punctuations as punctuations

    class FakeSpark:
        conf = type("Conf", (), {"set": lambda self, k, v: None})()

        def stop(self) -> None:
            pass

    def run_mode(spark, cfg, n, mode, workdir, routing):
        if mode == rr.punct(10):
            raise RuntimeError("Java heap space")
        return rr.Sample(mode, n, 1000, 1.0, 2, 1.0, 1000.0, rows_total=2000, batch_ms=500.0)

    monkeypatch.setattr(rr, "session", lambda cfg: FakeSpark())
    monkeypatch.setattr(rr, "run_none", lambda *a: None)
    monkeypatch.setattr(rr, "run_mode", run_mode)
    monkeypatch.setattr(punctuations, "route_keys", lambda spark, p: None)
    cfg = rr.RRConfig(sizes=(3,), granularities=(1, 10))
    result = rr.run_config(cfg)
    assert result["failed"] == {"RR-3 punctuations 10": "RuntimeError: Java heap space"}
    measured = {r["mode"] for r in result["results"]}
    assert rr.punct(1) in measured and rr.punct(10) not in measured
    assert "RR-3 punctuations 10 failed" in rr_report.figures(result)[0].note


# ------------------------------------------------------------------ real Spark


def tiny(stages: int = 2) -> BenchConfig:
    return BenchConfig(fronts=2, rows_per_batch=200, payload_bytes=4, stages=stages,
                       partitions=P, seconds=1.0, warmup_batches=1, rounds=1)


@pytest.mark.slow  # ~40 s; the harness on Spark by default: the test below
@pytest.mark.spark
def test_punctuations_on_spark_align_and_count(spark: Any) -> None:
    from lowtide.bench.punctuations import route_keys

    cfg, g = tiny(), 10
    with tempfile.TemporaryDirectory() as workdir:
        s = rr.run_punctuations(spark, cfg, workdir, g, route_keys(spark, P))
    per_front = s.rows_total // cfg.fronts
    markers = cfg.fronts * (per_front // g)
    assert s.rows_total > 0 and s.markers == markers  # each aligned at the sink once
    # each shuffle moves the markers its upstream stage forwarded, p copies each
    assert s.marker_rows == [markers * P, markers * P * P, markers * P]
    # latencies: the markers of the batches measured for throughput, not the warm-up's
    assert 0 < len(s.after_last_row_ms) == len(s.from_front_ms) < markers


@pytest.mark.spark
def test_lowtide_harness_counts_add_up(spark: Any) -> None:
    cfg = tiny()
    with tempfile.TemporaryDirectory() as workdir:
        s = rr.run_lowtide(spark, cfg, workdir, "lowtide")
    # sources + one batch per map task + the null sink's receipts from each last-map
    # task, per completed micro-batch
    assert s.messages == s.expected_messages > 0
    assert s.rows_total > 0 and s.after_last_row_ms and s.after_commit_ms


def test_notification_delays_start_at_each_batchs_last_ack_line(tmp_path: Any) -> None:
    """Trace lines come per task (the null sink's receipts) or per batch (other sinks):
    a batch's acks start with its last line; an update counts for the batch whose acks
    it follows, if it came before the next batch's; batches without rows are left out."""
    from lowtide.bench.spark import first_updates, notification_delays

    trace = tmp_path / "trace.txt"
    trace.write_text("1 1000000 0 5\n1 3000000 0 5\n2 9000000 0 0\n3 10000000 0 4\n"
                     "4 20000000 0 4\n")
    updates = [(4_000_000, 7), (12_000_000, 8), (25_000_000, 9)]
    arrived = first_updates(str(trace), updates)
    assert arrived == {1: (3_000_000, 4_000_000), 3: (10_000_000, 12_000_000),
                       4: (20_000_000, 25_000_000)}
    assert notification_delays(arrived) == {1: 1.0, 3: 2.0, 4: 5.0}
    assert first_updates(str(tmp_path / "none.txt"), updates) == {}


def test_notification_delays_count_only_the_batches_measured_for_throughput() -> None:
    """The figure's delays are those of the batches whose rows made the throughput
    figure; the query's warm-up and last batches are kept apart (and their worst shown)."""
    from lowtide.bench.spark import Measured, _Tally

    m = Measured(rows=10, secs=1.0, batches=2, first=3, last=5)
    t = _Tally()
    t.add_delays(m, {2: 240.0, 4: 3.0, 5: 9.0, 6: 1.0}, "round 2")
    assert t.delays == [3.0, 9.0]
    assert sorted(t.uncounted) == [(1.0, "round 2, batch 6, stopping"),
                                   (240.0, "round 2, batch 2, warm-up")]
    assert t.slowest == (9.0, "round 2, batch 5")


def test_full_collections_are_timed_and_younger_ones_ignored() -> None:
    import gc

    from lowtide.bench.spark import FullCollections

    full = FullCollections()
    gc.callbacks.append(full)
    try:
        gc.collect(0)
        gc.collect(1)
        assert full.ms == []
        gc.collect()
        assert len(full.ms) == 1 and full.ms[0] >= 0.0
    finally:
        gc.callbacks.remove(full)
