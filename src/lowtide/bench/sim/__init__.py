"""`lowtide bench sim`: the paper's cluster-scale axes by discrete-event simulation.

The simulation drives the real core (local trackers, tracker, shards) on a simulated
cluster and compares it with Flink-style aligned markers: service traffic, notification
latency and snapshot buffering, by graph size, nodes and granularity. Modules:
``events`` (virtual time, links), ``dataflow`` (the chain on K nodes), ``tracking``
(lowtide modes), ``markers``, ``snapshots``, ``experiments`` (runs and axes) and
``report`` (tables, figures).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from typing import Any

from lowtide.bench.sim.experiments import FULL, QUICK, Plan, run_axes
from lowtide.bench.sim.report import REPORT_INTRO, figures, table

__all__ = ["REPORT_INTRO", "add_arguments", "figures", "main", "register", "run"]


def run(quick: bool, seed: int = 1) -> dict[str, Any]:
    """Every axis and mode; progress on stderr; the JSON result (``{"bench": "sim"}``)."""
    plan = QUICK if quick else FULL
    seeded = replace(
        plan, base=replace(plan.base, seed=seed), snapshot=replace(plan.snapshot, seed=seed)
    )
    return run_plan(seeded, quick)


def run_plan(plan: Plan, quick: bool) -> dict[str, Any]:
    return {
        "bench": "sim",
        "quick": quick,
        "config": asdict(plan.base),
        "snapshot_config": asdict(plan.snapshot),
        "hop_budget": plan.hop_budget,
        "axes": run_axes(plan),
    }


def main(args: argparse.Namespace) -> int:
    result = run(args.quick, args.seed)
    for name, axis in result["axes"].items():
        print(table(name, axis))
        print()
    print(json.dumps(result))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="fewer inputs per run (same axes)")
    p.add_argument("--seed", type=int, default=1, help="the simulation's seed (default 1)")
    p.set_defaults(handler=main)


def register(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    add_arguments(
        bench.add_parser(
            "sim", help="simulated cluster: traffic, latency, buffering vs markers (no Spark)"
        )
    )
