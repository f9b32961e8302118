"""``lowtide bench spark``'s rounds without Spark: the sides take turns at running
first, and each ratio pairs the runs of one round, whatever their order."""

from __future__ import annotations

import math
from typing import Any

import pytest

from lowtide.bench.spark import maps
from lowtide.bench.spark.measure import BenchConfig, Measured


def test_maps_rounds_rotate_and_pair_runs_of_one_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[tuple[int, str]] = []
    rate = {"untracked": 100.0, "tracked": 90.0}  # per second of batch time and of CPU

    def fake_run(_spark: Any, _cfg: BenchConfig, _workdir: str,
                 variant: str) -> tuple[Measured, dict[int, float]]:
        r = len(order) // 2
        order.append((r, variant))
        # every round slower than the last: a pairing across rounds would show it
        rows = int(rate[variant] * 10 / (r + 1))
        maps.CPU.update(rows=rows, last=10.0)
        return Measured(rows, 10.0, 3, 0, 2), {}

    # the run's figures go to the module's own dicts: fresh ones, left behind by none
    monkeypatch.setattr(maps, "CPU", {})
    monkeypatch.setattr(maps, "BY_PROCESS", {})
    monkeypatch.setattr(maps, "_run_variant", fake_run)
    cfg = BenchConfig(rounds=4, variants=("tracked",))
    tally = maps._rounds(None, cfg, "", {})
    assert [v for _, v in order] == ["untracked", "tracked", "tracked", "untracked",
                                     "untracked", "tracked", "tracked", "untracked"]
    # round 1 warms up; rounds 2-4 counted, each tracked run against its round's own
    assert tally["tracked"].ratios == pytest.approx([0.9, 0.9, 0.9], abs=0.01)
    assert tally["tracked"].cpu_ratios == pytest.approx([0.9, 0.9, 0.9], abs=0.01)


def test_maps_same_plan_ratio_pairs_tracked_with_untracked_hash(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A tracked repartition hashes its column, so the bench also sets the tracked maps
    against the untracked ones on that plan (``untracked-hash``), round by round."""
    rate = {"untracked": 100.0, "tracked": 110.0, "untracked-hash": 120.0}
    runs: list[str] = []

    def fake_run(_spark: Any, _cfg: BenchConfig, _workdir: str,
                 variant: str) -> tuple[Measured, dict[int, float]]:
        rows = int(rate[variant] * 10 / (len(runs) // 3 + 1))  # slower every round
        runs.append(variant)
        maps.CPU.update(rows=rows, last=10.0)
        return Measured(rows, 10.0, 3, 0, 2), {}

    monkeypatch.setattr(maps, "CPU", {})
    monkeypatch.setattr(maps, "BY_PROCESS", {})
    monkeypatch.setattr(maps, "_run_variant", fake_run)
    tally = maps._rounds(None, BenchConfig(rounds=3, variants=("tracked", "untracked-hash")),
                         "", {})
    same = maps.same_plan(tally)
    assert same["same_plan_throughput_ratio"] == pytest.approx(110 / 120, abs=0.02)
    assert same["same_plan_cpu_ratio"] == pytest.approx(110 / 120, abs=0.02)
    not_run = maps.same_plan({"tracked": tally["tracked"]})
    assert math.isnan(not_run["same_plan_cpu_ratio"])
