"""``lowtide bench spark``, ``lowtide spark demo`` and ``lowtide spark status``."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lowtide.core.time import TimeGrid


def register(subparsers: Any, bench_subparsers: Any) -> None:
    from lowtide.spark import bench

    b = bench_subparsers.add_parser(
        "spark", help="tracked vs untracked 3-stage PySpark pipeline; notification delay"
    )
    bench.add_arguments(b)
    b.set_defaults(handler=bench.main)

    spark = subparsers.add_parser("spark", help="PySpark tracked pipelines")
    sub = spark.add_subparsers(dest="spark_command", metavar="COMMAND")

    demo = sub.add_parser("demo", help="run a tracked generator pipeline and show progress")
    demo.add_argument("--tracker", help="tcp://host:port of `lowtide serve` (default: embedded)")
    demo.add_argument("--secret-file", type=Path, help="shared secret (else $LOWTIDE_SECRET)")
    demo.add_argument("--fronts", type=int, default=3)
    demo.add_argument("--rate", type=float, default=2_000.0, help="rows/s over all fronts")
    demo.add_argument("--lag-ms", type=int, default=0, help="the last front lags this much")
    demo.add_argument("--stall-after-ms", type=int, help="the last front stalls after this")
    demo.add_argument("--seconds", type=float, default=30.0)
    demo.add_argument("--master", default="local[2]")
    demo.set_defaults(handler=run_demo)

    if "demo" not in subparsers.choices:  # the core walkthrough used to be `lowtide demo`
        from lowtide.spark import demo as exact_demo

        top = subparsers.add_parser(
            "demo", help="exact windows vs a withWatermark query, live view, then JSON"
        )
        exact_demo.add_arguments(top)
        top.set_defaults(handler=exact_demo.main)

    status = sub.add_parser("status", help="segments, lag, rows/s, stalled fronts, losses")
    status.add_argument("--url", default="tcp://127.0.0.1:7433")
    status.add_argument("--secret-file", type=Path, help="shared secret (else $LOWTIDE_SECRET)")
    status.add_argument("--interval", type=float, default=1.0)
    status.add_argument("--once", action="store_true")
    status.set_defaults(handler=run_status)


def _secret(path: Path | None) -> str | None:
    from lowtide.service.auth import load_secret

    raw = load_secret(path)
    return raw.decode() if raw is not None else None


def run_status(args: argparse.Namespace) -> int:
    import asyncio

    from lowtide.service.auth import load_secret
    from lowtide.service.lane import LaneConfig
    from lowtide.service.progress import RowRates
    from lowtide.service.status import poll_status
    from lowtide.spark.pipeline import status_of

    rates = RowRates()
    lane = LaneConfig(secret=load_secret(args.secret_file), connect_timeout_s=5.0)

    def show(doc: dict[str, Any] | None) -> bool:
        if doc is None:
            print(f"{args.url}: no answer (retrying)", file=sys.stderr)
            return not args.once
        grid = TimeGrid(int(doc.get("delta_ms", 10)))
        print(status_of(doc, grid, rates).render(grid.delta_ms), flush=True)
        print()
        return not args.once

    asyncio.run(poll_status(args.url, lane, show, args.interval, 5.0))
    return 0


def run_demo(args: argparse.Namespace) -> int:
    py = sys.executable
    os.environ.setdefault("PYSPARK_PYTHON", py)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", py)
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql import SparkSession

    from lowtide.spark.generator import GeneratorSpec
    from lowtide.spark.pipeline import Pipeline

    last = args.fronts - 1
    spec = GeneratorSpec(
        fronts=args.fronts, rate=args.rate, payload_bytes=16,
        lag_ms={last: args.lag_ms} if args.lag_ms else {},
        stall={last: (args.stall_after_ms, None)} if args.stall_after_ms is not None else {},
    )
    spark = (
        SparkSession.builder.master(args.master).appName("lowtide-demo")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", "-Xss32m").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    pipe = Pipeline(spark, "demo", tracker=args.tracker, secret=_secret(args.secret_file))

    def parse(b: pa.RecordBatch) -> pa.RecordBatch:
        return pa.record_batch({"front": b["front"], "seq": b["seq"],
                                "size": pc.binary_length(b["payload"])})

    def even(b: pa.RecordBatch) -> Any:
        return pc.equal(pc.bit_wise_and(b["seq"], 1), 0)

    stream = (pipe.generate(spec).map(parse, "front int, seq long, size int", name="parse")
              .repartition(2).filter(even, name="even"))
    with tempfile.TemporaryDirectory(prefix="lowtide-demo-") as tmp:
        query = None
        try:
            query = stream.to_null(checkpoint=tmp, trigger="200 milliseconds")
            print(f"tracker {pipe.tracker.url}; segments {list(query.graph.names)}")
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                time.sleep(1.0)
                if query.query.exception() is not None:
                    print(f"query failed: {query.query.exception()}", file=sys.stderr)
                    return 1
                print(pipe.status().render(pipe.grid.delta_ms), flush=True)
                print()
        finally:
            if query is not None:
                query.stop()
            pipe.close()
            spark.stop()
    return 0
