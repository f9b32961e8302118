"""Generator schedule: deterministic rows, monotonic offsets, safe heartbeats."""

from __future__ import annotations

import time
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.core.time import TimeGrid
from lowtide.spark.sources.generator import (
    GeneratorSpec,
    gen_partitions,
    gen_rows,
    initial_offset,
    label_ms,
    next_offset,
    rows_before,
)

GRID = TimeGrid(delta_ms=10)


@given(st.floats(0.5, 50_000), st.integers(0, 100_000))
def test_rows_before_agrees_with_labels(rate: float, dt: int) -> None:
    t0 = 1_000_000
    n = rows_before(t0, rate, t0 + dt)
    labels = label_ms(t0, rate, np.arange(n + 1))
    assert (labels[:n] <= t0 + dt).all() and labels[n] > t0 + dt


@settings(max_examples=30)
@given(st.floats(50_000, 4_000_000), st.integers(0, 10**9))
def test_rows_before_a_fast_front_looks_at_few_labels(rate: float, dt: int) -> None:
    """The bench's fronts label a million rows a second: counting them walked the
    rows of one millisecond one at a time, 2 ms of the source's offset planning."""
    import lowtide.spark.sources.generator as gen

    t0 = 1_700_000_000_000
    with mock.patch.object(gen, "label_ms", wraps=label_ms) as spy:
        n = rows_before(t0, rate, t0 + dt)
    assert spy.call_count <= 4
    labels = label_ms(t0, rate, np.array([n - 1, n]))
    assert labels[0] <= t0 + dt < labels[1]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(0, 400), min_size=1, max_size=15),
    st.floats(0, 2),
    st.dictionaries(st.integers(0, 2), st.integers(0, 300), max_size=2),
    st.integers(1, 500) | st.none(),
)
def test_offsets_and_heartbeats_are_safe(steps, skew, lag, max_rows) -> None:
    spec = GeneratorSpec(fronts=3, rate=2_000.0, skew=skew, lag_ms=lag,
                         stall={1: (500, 400)}, max_rows_per_batch=max_rows)
    t0 = 5_000_000
    off = initial_offset(spec, t0, GRID)
    now = t0
    seen: dict[int, list[int]] = {f: [] for f in spec.front_ids()}
    last_hb = {f: -1 for f in spec.front_ids()}
    for dt in steps:
        now += dt
        end = next_offset(spec, off, now, GRID)
        for part in gen_partitions(off, end):
            batch, times, _acks = gen_rows(spec, part, GRID)
            seen[part.front] += batch.column("seq").to_pylist()
            hb = part.extra[1]
            assert hb >= last_hb[part.front]
            last_hb[part.front] = hb
            # rule: no later row of this front has a time below its heartbeat
            rest = label_ms(t0, spec.rate_of(part.front), np.arange(part.end, part.end + 5))
            assert (rest // GRID.delta_ms >= hb).all()
            # rows are due: labelled at or before now - lag
            if len(times):
                assert batch.column("event_ms").to_numpy().max() <= now - lag.get(part.front, 0)
        off = end
    for f, seqs in seen.items():
        assert seqs == list(range(len(seqs)))  # no gap, no duplicate, in order
        assert last_hb[f] <= GRID.slot_of(now)


def test_rows_are_deterministic() -> None:
    spec = GeneratorSpec(fronts=2, rate=1_000.0, payload_bytes=8)
    off = initial_offset(spec, 10_000, GRID)
    end = next_offset(spec, off, 10_300, GRID)
    parts = gen_partitions(off, end)
    a = [gen_rows(spec, p, GRID)[0] for p in parts]
    b = [gen_rows(spec, p, GRID)[0] for p in parts]
    assert all(x.equals(y) for x, y in zip(a, b, strict=True))
    assert a[0].column("payload")[3].as_py() == bytes([3]) * 8


def test_idle_front_keeps_heartbeating() -> None:
    spec = GeneratorSpec(fronts=2, rate=1_000.0, skew=50.0)  # front 1 gets ~nothing
    off = initial_offset(spec, 0, GRID)
    end = next_offset(spec, off, 2_000, GRID)
    parts = {p.front: p for p in gen_partitions(off, end)}
    assert parts[1].end == parts[1].start or parts[1].end < 3
    assert parts[1].extra[1] >= 190  # heartbeat moved with the clock


def test_stalled_front_freezes_then_resumes() -> None:
    spec = GeneratorSpec(fronts=2, rate=1_000.0, stall={1: (100, 500)})
    off = initial_offset(spec, 0, GRID)
    mid = next_offset(spec, off, 400, GRID)
    assert mid["f1"]["hb"] == 10 and mid["f0"]["hb"] == 40
    late = next_offset(spec, mid, 700, GRID)
    assert late["f1"]["hb"] == 70 and late["f1"]["seq"] == late["f0"]["seq"]


def test_tasks_group_the_fronts_as_the_offsets_say() -> None:
    """``tasks=2``: front i in task i % 2, each front still its own part (its acks one
    keyed batch per front); the rows are those of one task per front. The grouping is
    read from the offsets: an offset logged without it (a checkpoint from before) reads
    one task per front whatever the spec says."""
    from lowtide.spark.sources.generator import FrontsPartition

    spec = GeneratorSpec(fronts=4, rate=1_000.0, first_front=1, tasks=2)
    off = initial_offset(spec, 10_000, GRID)
    end = next_offset(spec, off, 10_300, GRID)
    assert off["tasks"] == end["tasks"] == 2
    grouped = gen_partitions(off, end)
    assert all(isinstance(g, FrontsPartition) for g in grouped)
    assert [[p.front for p in g.parts] for g in grouped] == [[1, 3], [2, 4]]
    single = gen_partitions({k: v for k, v in off.items() if k != "tasks"},
                            {k: v for k, v in end.items() if k != "tasks"})
    assert [(p.front, p.start, p.end, p.extra) for p in single] == sorted(
        (p.front, p.start, p.end, p.extra) for g in grouped for p in g.parts)
    old = {k: v for k, v in off.items() if k != "tasks"}
    assert "tasks" not in next_offset(spec, old, 10_300, GRID)
    # a group whose fronts have neither rows nor a new heartbeat is left out
    quiet = {**end, "f2": off["f2"], "f4": off["f4"]}
    assert [[p.front for p in g.parts] for g in gen_partitions(off, quiet)] == [[1, 3]]
    with pytest.raises(ValueError, match="tasks must be 0"):
        GeneratorSpec(tasks=-1)


def test_spec_json_roundtrip() -> None:
    spec = GeneratorSpec(fronts=3, lag_ms={1: 200}, stall={2: (1_000, None)}, tasks=2)
    assert GeneratorSpec.from_json(spec.to_json()) == spec


def test_fixed_t0_fixes_the_initial_offset() -> None:
    from lowtide.spark.sources.generator import GenStreamReader

    spec = GeneratorSpec(fronts=2, rate=1_000.0, lag_ms={1: 300}, t0_ms=1_700_000_000_000)
    opts = {"spec": spec.to_json(), "tracking": "false", "delta_ms": "10"}
    first = GenStreamReader(opts).initialOffset()
    time.sleep(0.05)
    second = GenStreamReader(opts).initialOffset()
    assert first == second and first["t0"] == spec.t0_ms
    assert GeneratorSpec.from_json(spec.to_json()) == spec


def _collect(spark, spec: GeneratorSpec, name: str) -> Any:
    df = (spark.readStream.format("lowtide_gen").option("spec", spec.to_json())
          .option("tracking", "false").option("delta_ms", "10").load())
    return (df.writeStream.format("memory").queryName(name)
            .trigger(processingTime="200 milliseconds").start())


@pytest.mark.spark
def test_two_streams_of_one_spec_serve_the_same_rows(spark) -> None:
    """Two queries started apart, each with its own reader: with t0 fixed in the spec
    they read identical rows (time and payload included), the lagging front too."""
    from lowtide.spark.pipeline import register_sources

    register_sources(spark)
    n = 150
    t0 = time.time_ns() // 1_000_000
    spec = GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4, lag_ms={1: 1_000},
                         rows_per_front=n, t0_ms=t0)
    queries = [_collect(spark, spec, "gen_a")]
    time.sleep(1.0)  # the second query starts later: its reader's clock differs
    queries.append(_collect(spark, spec, "gen_b"))
    try:
        deadline = time.monotonic() + 120
        while any(spark.table(q.name).count() < 2 * n for q in queries):
            assert all(q.exception() is None for q in queries)
            assert time.monotonic() < deadline, "the streams did not read every row"
            time.sleep(0.5)
    finally:
        for q in queries:
            q.stop()
    rows = [{(r.front, r.seq, r.event_ms, bytes(r.payload))
             for r in spark.table(q.name).collect()} for q in queries]
    assert len(rows[0]) == 2 * n and rows[0] == rows[1]
    assert min(r[2] for r in rows[0]) == t0  # row 0 of each front is labelled at t0
