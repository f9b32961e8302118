"""``lowtide bench sweep`` on the shared SparkSession, tiny: two watermark delays around
a lagging front and lowtide, every count checked against the outputs and the batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lowtide.apps import demo, demo_report
from lowtide.bench import sweep

pytestmark = pytest.mark.spark


@pytest.mark.slow  # ~23 s; the demo's windows against the batch by default: test_demo.py
def test_sweep_counts_add_up(spark, tmp_path: Path) -> None:
    cfg = sweep.SweepConfig(delays_ms=(300, 15_000), seconds=15.0, lag_ms=12_000)
    result = sweep.sweep(spark, cfg, keep_dir=str(tmp_path))
    assert json.loads(json.dumps(result)) == result and result["bench"] == "sweep"

    spec = demo.demo_spec(cfg.fronts, cfg.rate, cfg.lag_ms, result["t0_ms"])
    batch = demo.batch_recompute(spark, spec, result["horizon_ms"])
    points = [("lowtide", result["lowtide"])]
    points += [(f"watermark_{p['delay_ms']}", p) for p in result["watermark"]]
    for name, p in points:
        got = demo_report.read_windows(str(tmp_path / name / "out"))
        judged = batch[batch["end_ms"] <= p["judged_to_ms"]]
        assert p["windows_emitted"] == len(got) > 0
        # every batch window up to the judged end is exact, partial or missing
        assert p["windows"] == len(judged) == p["exact"] + p["partial"] + p["missing"]
        assert p["unexpected"] == 0 and p["duplicates"] == 0
        assert len(got) == p["exact"] + p["partial"]
        # dropped rows = rows in the batch - rows in the results
        assert p["rows"] == judged["n"].sum()
        assert p["rows_dropped"] == p["rows"] - got["n"].sum() == p["rows"] - p["rows_emitted"]

    lt, (short, long_) = result["lowtide"], result["watermark"]
    assert lt["rows_dropped"] == 0 and lt["matches_batch"] is True
    # a 15 s watermark covers the front lagging 12 s; whether the 300 ms one drops rows
    # depends on the micro-batch interval (a row arriving in the micro-batch that closes
    # its window still counts), so only its accounting is checked above
    assert long_["rows_dropped"] == 0 and long_["matches_batch"] is True
    assert short["matches_batch"] == (short["rows_dropped"] == 0 == short["missing"])

    figs = sweep.figures(result)
    assert [f.name for f in figs] == ["watermark_sweep_dropped", "watermark_sweep_delay"]
    assert list(figs[0].x) == [0.3, 15.0]
    assert figs[0].series["withWatermark"] == [short["rows_dropped"], long_["rows_dropped"]]
    assert figs[1].series["lowtide p50"] == [lt["delay_p50_ms"]] * 2
    assert all(f.note for f in figs)
