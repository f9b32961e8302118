"""`lowtide bench capacity` at tiny sizes: it runs against a central tracker and 2 shards,
the tracker applies exactly the entries the agents sent, and its figures build."""

from __future__ import annotations

import argparse
import doctest

import pytest

import lowtide.bench.capacity
from lowtide.bench.capacity import CapacityConfig, main, register, run
from lowtide.bench.capacity_report import figures

TINY = CapacityConfig(
    multipliers=(1, 3),
    agents=1,
    items_per_s=1_000,
    round_ms=50,
    seconds=0.3,
    drain_timeout_s=30,
)


def test_doctests() -> None:
    result = doctest.testmod(lowtide.bench.capacity)
    assert result.failed == 0 and result.attempted > 0


def test_registers_lowtide_bench_capacity() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    register(sub, sub.add_parser("bench").add_subparsers())
    args = parser.parse_args(["bench", "capacity", "--quick", "--multipliers", "1,2"])
    assert args.handler is main and args.quick and args.multipliers == "1,2"


@pytest.mark.socket
def test_capacity_applies_every_entry_sent_and_builds_figures() -> None:
    result = run(quick=True, config=TINY)
    assert result["bench"] == "capacity"
    runs = result["runs"]
    assert [(r["deployment"], r["multiplier"]) for r in runs] == [
        ("central", 1),
        ("central", 3),
        ("2 shards", 1),
        ("2 shards", 3),
    ]
    for r in runs:
        items = TINY.rounds * TINY.slots * TINY.agents
        assert r["entries_sent"] == r["entries_applied"] == 6 * r["multiplier"] * items
        assert r["notify_p50_ms"] is not None
    figs = figures(result)
    names = [f.name for f in figs]
    assert names[:2] == ["scalability_01x", "scalability_03x"]
    assert all(set(f.series) == {"central", "2 shards"} for f in figs)
    assert all(f.paper and f.note for f in figs)
