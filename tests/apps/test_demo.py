"""``lowtide demo``, run as a user runs it (its own process): its output is clean (no
stack trace, no Spark ERROR line), lowtide drops nothing and matches the batch
recomputation, and both queries and the batch recomputation see the same events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lowtide.apps import demo
from tests.cli.helpers import run_clean

pytestmark = pytest.mark.spark


def read_events(spec: Any, ckpt: str) -> Any:
    """The events a generator query read (its source is deterministic)."""
    got = demo.served(ckpt)
    assert got is not None, f"{ckpt}: no committed micro-batch"
    return demo.events(spec, *got)


def as_set(events) -> set[tuple[int, int, int]]:
    return set(zip(events["front"].tolist(), events["seq"].tolist(),
                   events["event_ms"].tolist(), strict=True))


def test_demo_is_clean_and_its_json_line_says_where_the_time_goes(tmp_path: Path) -> None:
    out = run_clean("demo", "--seconds", "12", "--fronts", "4", "--lag-ms", "7000",
                    "--rate", "400", "--watermark-ms", "200", "--json", "--dir", str(tmp_path))
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["bench"] == "demo"
    assert doc["matches_batch"] is True and doc["same_events"] is True
    lt, wm = doc["lowtide"], doc["watermark"]
    for q in (lt, wm):  # each query's delays and first window, the lag beside them
        assert set(q) >= {"windows", "late_dropped", "delay_p50_ms", "delay_p99_ms",
                          "lag_ms", "first_window_s"}
    assert lt["lag_ms"] == wm["lag_ms"] == doc["lag_ms"] == 7000
    assert doc["first_window_s"] == lt["first_window_s"] and wm["first_window_s"] > 0
    assert lt["late_dropped"] == 0 and lt["differ_from_batch"] == 0
    assert lt["windows"] > 0 and wm["windows"] > 0
    # each window out in the micro-batch that read its last rows (its results come
    # from the driver, which reads the min time after the batch's tasks)
    assert lt["batches_after_input_p50"] == lt["batches_after_input_max"] == 0
    for q in (lt, wm):  # where the time goes: start-up phases in order, batch times
        phases = [q["startup"][k] for k in ("query_started_s", "first_batch_planned_s",
                                            "first_batch_done_s")]
        assert phases == sorted(phases) and q["batch_p50_ms"] > 0
        # a micro-batch phase by phase (Spark's durationMs), the median once warm
        assert {"latestOffset", "queryPlanning", "addBatch", "walCommit",
                "commitOffsets"} <= set(q["phases_p50_ms"])
        assert q["phases_p50_ms"]["addBatch"] <= q["phases_p50_ms"]["triggerExecution"]
    assert 0 <= doc["session_s"] <= phases[0]  # the shared session: started before
    # CPU of the demo's processes per micro-batch once warm, by kind: the JVM's is there
    cpu = doc["cpu_ms_per_batch"]
    assert cpu["jvm"] > 0 and cpu["total"] == pytest.approx(
        sum(v for k, v in cpu.items() if k != "total"), abs=1)
    # from run()'s start to lowtide's first result file: after the first batch's work
    assert 0 < doc["first_window_s"] < 12 + 300
    # the data's own floor: the first window's end plus the 7 s lag, before any result
    assert 7 <= doc["first_window_floor_s"] - doc["session_s"] <= 7 + 2 + 1
    assert doc["first_window_floor_s"] < doc["first_window_s"]
    # whether the 200 ms watermark drops rows of the front lagging 7 s depends on the
    # micro-batch interval on this machine; its count is checked in test_sweep

    # what each query read (its checkpoint's offsets, its own t0) against the events
    # the batch recomputation uses (the spec's t0)
    spec = demo.demo_spec(4, 400.0, 7000, doc["t0_ms"])
    lt_read, wm_read = (as_set(read_events(spec, str(tmp_path / ckpt)))
                        for ckpt in ("lt_ckpt", "wm_ckpt"))
    union = lt_read | wm_read
    assert lt_read & wm_read
    # every front was read up to at least `horizon` by one query or the other
    horizon = 1 + min(max(ms for f, _s, ms in union if f == front) for front in spec.front_ids())
    assert as_set(demo.batch_events(spec, horizon)) == {e for e in union if e[2] < horizon}
