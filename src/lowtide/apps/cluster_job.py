"""A tracked windowed pipeline to run with ``spark-submit`` on a cluster (docs/cluster.md).

The demo's pipeline (generator -> parse -> filter -> 2-second exact windows -> Parquet)
reporting to a standalone ``lowtide serve`` (``--tracker``; its secret in
``$LOWTIDE_SECRET``), on whatever master spark-submit names. It runs until the sink is
complete ``--seconds`` past the generator's start, stops the query, recomputes the
same windows with a Spark batch job over the same (deterministic) events and prints
one JSON line: windows, how many equal the batch, the executors that ran it, and the
lowtide observed metrics of the query's last progress with rows at the sink (read on
the driver, where Spark computes them).

    spark-submit --master spark://HOST:7077 --py-files lowtide.zip \\
        src/lowtide/apps/cluster_job.py --tracker tcp://HOST:7433 --dir /shared/run
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from lowtide.apps import demo
from lowtide.apps.demo_report import compare, judged_to_ms, matches_batch, read_windows
from lowtide.apps.startup import prepare
from lowtide.service import wall_ms


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cluster_job", description=__doc__.split("\n\n")[0])
    p.add_argument("--tracker", required=True, help="tcp://host:port of `lowtide serve`")
    p.add_argument("--dir", required=True, help="output and checkpoint (shared by all nodes)")
    p.add_argument("--seconds", type=float, default=6.0, help="event time to wait for")
    p.add_argument("--fronts", type=int, default=2)
    p.add_argument("--rate", type=float, default=200.0, help="rows/s over all fronts")
    p.add_argument("--timeout-s", type=float, default=600.0)
    return p.parse_args(argv)


def executors(spark: Any) -> int:
    """How many executors the application has (the status tracker lists the driver too)."""
    return len(spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()) - 1


def package_on_executors(spark: Any) -> list[str]:
    """Where the executors' Python workers import lowtide from (the ``--py-files`` zip)."""
    rdd = spark.sparkContext.parallelize(range(4), 4)
    return sorted(set(rdd.map(lambda _: __import__("lowtide").__file__).collect()))


def observed(query: Any) -> dict[str, Any] | None:
    """lowtide's observed metrics of the latest progress whose batch had rows at the
    sink (a batch without rows there has null figures)."""
    for progress in reversed(query.recentProgress):
        row = (progress.get("observedMetrics") or {}).get("lowtide")
        if row is not None and row["sink_min_time"] is not None:
            return dict(row.asDict(recursive=True))
    return None


def run(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    spec = demo.demo_spec(args.fronts, args.rate, 0, wall_ms())
    prepare(spark)
    out, ckpt = os.path.join(args.dir, "out"), os.path.join(args.dir, "ckpt")
    pipe, query = demo.start_lowtide(spark, spec, out, ckpt, tracker=args.tracker)
    try:
        horizon_ms = spec.t0_ms + int(args.seconds * 1000)
        query.wait_for_min_time(pipe.grid.slot_of(horizon_ms), timeout_s=args.timeout_s)
        query.stop()
        metrics = observed(query)
        complete_ms = pipe.grid.slot_start_ms(query.min_time())
    finally:
        pipe.close()
    got = read_windows(out)
    judged_ms = judged_to_ms(got, complete_ms)
    cmp = compare(got, demo.batch_recompute(spark, spec, judged_ms), judged_ms)
    return {"bench": "cluster", "master": spark.sparkContext.master,
            "executors": executors(spark), "lowtide_on_executors": package_on_executors(spark),
            "windows": cmp["windows"], "exact": cmp["exact"],
            "differ": cmp["differ"], "missing": cmp["missing"],
            "duplicates": cmp["duplicates"], "unexpected": cmp["unexpected"],
            "matches_batch": cmp["windows"] > 0 and matches_batch(cmp), "observed": metrics}


def main(argv: list[str] | None = None) -> int:
    from lowtide.spark import SessionConfig

    args = parse_args(argv)
    # master=None: spark-submit's; quiet=False: the log file would not exist on other nodes
    spark = SessionConfig(master=None, app_name="lowtide-cluster-job", quiet=False).build()
    try:
        doc = run(spark, args)
    finally:
        spark.stop()
    print(json.dumps(doc), flush=True)
    return 0 if doc["matches_batch"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
