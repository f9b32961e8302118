"""``lowtide bench spark --shape union|join`` without running Spark: the shapes are
registered, the join's data gives about one match per row, and the report's last line
keeps the benchmark's JSON names."""

from __future__ import annotations

import argparse
import json

import pytest

from lowtide.bench.spark import add_arguments
from lowtide.bench.spark.measure import BenchConfig, dropped_late, report_versus
from lowtide.bench.spark.shapes import JOIN_KEYS, JOIN_LAG_MS, RUNNERS, SHAPES, _halves, _join_specs


def test_union_and_join_are_shapes() -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    for shape in ("union", "join"):
        assert p.parse_args(["--shape", shape]).shape == shape
        assert shape in RUNNERS
    assert set(SHAPES) == {"maps", "window", "union", "join", "speculative"}
    assert p.parse_args(["--shape", "speculative"]).shape == "speculative"
    with pytest.raises(SystemExit):
        p.parse_args(["--shape", "cycle"])


def test_the_union_halves_do_not_share_fronts() -> None:
    a, b = _halves(BenchConfig(fronts=2, rows_per_batch=1000))
    assert not set(a.front_ids()) & set(b.front_ids())
    assert a.max_rows_per_batch == b.max_rows_per_batch == 250


def test_join_keys_repeat_about_once_within_the_interval() -> None:
    a, b = _join_specs(BenchConfig(rows_per_batch=10_000))
    assert a.front_ids() == [0] and b.front_ids() == [1, 2]
    assert a.rate == b.rate and b.lag_ms == {2: JOIN_LAG_MS} and JOIN_LAG_MS > 1000
    repeat_ms = JOIN_KEYS * 1000.0 / a.rate  # one key's rows this far apart, per side
    assert 100 <= repeat_ms <= 200  # within 100 ms either way: one or two matches


def test_report_ends_with_the_json_names(capsys: pytest.CaptureFixture[str]) -> None:
    result = {"bench": "spark", "shape": "join", "throughput_ratio": 0.5, "cpu_ratio": 0.4,
              "round_ratios": [0.5], "round_cpu_ratios": [0.4], "rows_per_s_lowtide": 1.0,
              "rows_per_s_spark": 2.0, "rows_per_cpu_s_lowtide": 1.0,
              "rows_per_cpu_s_spark": 2.5, "cpu_ratio_without_jit": 0.45,
              "queries": ["Spark q", "lowtide q"],
              "spark_dropped_late": 1234, "lowtide_dropped_late": 0,
              "us_per_row_by_process": {
                  "spark": {"driver": 0.04, "JVM tasks": 1.5, "JVM query": 0.25,
                            "JVM compiler": 0.3, "JVM other": 2.9, "Python workers": 1.1},
                  "lowtide": {"driver": 0.5, "JVM tasks": 1.7, "JVM query": 0.33,
                              "JVM compiler": 0.2, "JVM other": 3.8,
                              "Python workers": 1.2}}}
    report_versus(result)
    print(json.dumps(result))
    out = capsys.readouterr().out.strip().splitlines()
    assert "rows dropped as late (counted rounds): Spark 1,234 (its watermark), lowtide 0" in out
    by_process = [line for line in out if line.startswith("lowtide q ")][-1]
    assert by_process.split()[-6:] == ["0.500", "1.700", "0.330", "0.200", "3.800", "1.200"]
    assert any("CPU without the JIT compiler 0.450" in line for line in out)
    last = json.loads(out[-1])
    assert {"bench", "shape", "throughput_ratio", "cpu_ratio", "cpu_ratio_without_jit",
            "spark_dropped_late", "lowtide_dropped_late"} <= set(last)


def test_dropped_late_sums_the_state_operators() -> None:
    progress = [{"stateOperators": [{"numRowsDroppedByWatermark": 3},
                                    {"numRowsDroppedByWatermark": 4}]},
                {"stateOperators": []}, {}]
    assert dropped_late(progress) == 7


def test_the_window_shape_writes_to_parquet_on_request_and_only_it() -> None:
    from lowtide.bench.spark import main

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args(["--shape", "window"]).sink == "null"
    assert p.parse_args(["--shape", "window", "--sink", "parquet"]).sink == "parquet"
    with pytest.raises(SystemExit, match="--sink parquet is for --shape window"):
        main(p.parse_args(["--shape", "join", "--sink", "parquet"]))
