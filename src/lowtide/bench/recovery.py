"""``lowtide bench recovery``: an operator's faults in one run, each against a known
ground truth. The leader tracker of a group killed twice under running clients, the
standby taking over (``failover_s``: the slower takeover, from the kill until the
standby serves; chaos's "leader killed" scenario, with a Kafka broker of its own), a
front that dies without unregistering, retired by the tracker's ``retire`` policy so the
rest progresses (``dead_front_retired``; chaos's "dead front"), and rows lost in a step,
the sink's windows reported stuck, replayed by time (issue 34 point 1,
:mod:`lowtide.bench.chaos.replay_fault`).

Human table, then as the last line::

    {"bench": "recovery", "failover_s": 1.8, "premature": 0, "lost": 0,
     "replayed_equals_batch": true, "false_loss_reports": 0, "dead_front_retired": true}

``false_loss_reports``: stuck windows the tracker reported with more items missing than
were lost there (a slow batch's rows reported as missing: issue 34 point 3), counted
while polling before the repair; the repair waits for the query's batches, so it never
wrote such rows (``premature`` would count them as rows written twice).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any


def main(args: argparse.Namespace) -> int:
    from lowtide.bench import chaos
    from lowtide.bench.chaos.replay_fault import lost_and_replayed, result_of
    from lowtide.bench.chaos.workload import Workload
    from lowtide.spark import SessionConfig

    by_name = {r.name: r for r in chaos.run(
        Workload(slots=24, secret=b"recovery-secret-0123456789abcdef"),
        ["leader killed", "dead front"])}
    failover, dead = by_name["leader killed"], by_name["dead front"]
    # the tracker's stuck-window warnings are what this bench counts (false_loss_reports)
    logging.getLogger("lowtide").setLevel(logging.ERROR)
    spark = SessionConfig(app_name="lowtide-bench-recovery", ui=False).build()
    try:
        with tempfile.TemporaryDirectory(prefix="lowtide-recovery-") as tmp:
            run = lost_and_replayed(spark, Path(tmp))
    finally:
        spark.stop()
    result = result_of(run)
    failover_s = round(max(failover.failover_s), 2) if failover.failover_s else None
    figures: dict[str, Any] = {
        "bench": "recovery", "failover_s": failover_s,
        "premature": len(result.premature) + len(failover.premature) + len(dead.premature),
        "lost": result.lost + failover.lost + dead.lost,
        "replayed_equals_batch": run.equals_batch(),
        "false_loss_reports": run.false_loss_reports(), "dead_front_retired": dead.retired > 0,
        "replayed_rows": run.repaired_rows,
        "repair_s": round(run.repair_s, 1), "load_1m": round(os.getloadavg()[0], 1)}
    print(f"{'part':<28} {'result'}")
    takeovers = ", ".join(f"{s:.1f}" for s in failover.failover_s)
    print(f"{'leader killed twice':<28} failover {takeovers} s; premature "
          f"{len(failover.premature)}, lost {failover.lost}")
    print(f"{'dead front':<28} retired by the policy: {dead.retired > 0}; premature "
          f"{len(dead.premature)}, lost {dead.lost}")
    print(f"{'rows lost, replayed':<28} {run.repaired_rows} rows in {run.repair_s:.1f} s; "
          f"equals batch: {run.equals_batch()}; premature {len(result.premature)}, "
          f"lost {result.lost}, false loss reports {run.false_loss_reports()}")
    print(json.dumps(figures))
    ok = (figures["premature"] == 0 and figures["lost"] == 0 and failover_s is not None
          and figures["dead_front_retired"])
    return 0 if ok and run.equals_batch() else 1


def register(subparsers: Any, bench_subparsers: Any) -> None:
    p = bench_subparsers.add_parser(
        "recovery", help="a standby's failover, a dead front retired, replay after a loss")
    p.set_defaults(handler=main)
