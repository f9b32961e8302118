"""``lowtide demo`` on the shared SparkSession: lowtide drops nothing and matches the
batch recomputation; the watermark query, on the same events with a front lagging
beyond its delay, drops rows (or waits longer)."""

from __future__ import annotations

import argparse
import json

import pytest

from lowtide.spark import demo

pytestmark = pytest.mark.spark


def test_demo_json_line(spark, capsys) -> None:
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args(["--seconds", "12", "--fronts", "4", "--lag-ms", "7000",
                              "--watermark-ms", "200", "--json"])
    doc = demo.run(spark, args)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(line) == doc
    assert doc["bench"] == "demo"
    assert doc["matches_batch"] is True
    lt, wm = doc["lowtide"], doc["watermark"]
    assert set(lt) >= {"windows", "late_dropped", "delay_p50_ms", "delay_p99_ms"}
    assert set(wm) >= {"windows", "late_dropped", "delay_p50_ms", "delay_p99_ms"}
    assert lt["late_dropped"] == 0 and lt["differ_from_batch"] == 0
    assert lt["windows"] > 0
    assert wm["late_dropped"] > 0 or (wm["delay_p99_ms"] or 0) > (lt["delay_p99_ms"] or 0)
