"""End to end, a speculative ``apply()`` window (rule 13): under a lagging front and
injected task failures before and after the step, across a restart from the
checkpoint, the changelog folded after every batch is the latest version of each
window (tombstones cancel the version they name, versions follow each other, nothing
follows a final), every row sits at its window's last slot, a batch run again writes
the same rows, and the finals (the columns of the window without ``speculative()``)
equal a batch recomputation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import lowtide
from lowtide.spark.sinks.changelog import finals
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once
from tests.spark.operators.changelogs import ByBatch, check_changelog, run_changelog
from tests.spark.operators.helpers import GRID, SCHEMA, STUCK_MS, parse

pytestmark = pytest.mark.spark
OUT = "n long, total double, lo double, hi double, avg double"


def stats(rows: pd.DataFrame) -> dict[str, Any]:
    """What the aggregating window's ``agg`` computes, in pandas."""
    a = rows["amount"]
    return {"n": len(rows), "total": a.sum(), "lo": a.min(), "hi": a.max(), "avg": a.mean()}


@pytest.mark.slow  # ~17 s; the changelog of apply by default: test_speculative_apply.py
def test_early_apply_rows_then_finals_under_a_lagging_front_failures_and_a_restart(
        spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=3, rate=240.0, payload_bytes=4, lag_ms={2: 1500})
    pipe = lowtide.Pipeline(spark, "specapply", grid=GRID, stuck_after_ms=STUCK_MS)
    before = fail_once(lambda b, p: b % 5 == 3 and p == 0)
    after = fail_once(lambda b, p: b % 4 == 2)
    stream = (pipe.generate(spec).map(parse, SCHEMA, name="parse")
              .transform(lambda df: df.mapInArrow(before, df.schema))
              .window("1 second", key="user", name="win").apply(stats, OUT).speculative()
              .transform(lambda df: df.mapInArrow(after, df.schema)))
    assert stream.segment_names() == ["parse", "win", "win.state", "sink"]
    sink = ByBatch()
    try:
        t0, final = run_changelog(stream, sink, tmp_path / "ckpt", 1500, restart_at=120,
                                  past=200, operators=1)
    finally:
        pipe.close()
    assert not sink.rerun_differs, f"batches run again with other rows: {sink.rerun_differs}"
    frames = [sink.batches[b] for b in sorted(sink.batches)]
    check_changelog(frames, spec, t0, final)
    exact = finals(pd.concat(frames, ignore_index=True))
    assert list(exact.columns[:8]) == ["user", "window_start", "window_end", "n", "total",
                                       "lo", "hi", "avg"]  # as without speculative()
