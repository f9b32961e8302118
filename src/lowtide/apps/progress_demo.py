"""``lowtide spark demo``: a tracked generator pipeline (parse -> repartition -> filter
-> null sink) with the tracker's progress table printed every second."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def add_arguments(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--tracker", help="tcp://host:port of `lowtide serve` (default: embedded)")
    demo.add_argument("--secret-file", type=Path, help="shared secret (else $LOWTIDE_SECRET)")
    demo.add_argument("--fronts", type=int, default=3)
    demo.add_argument("--rate", type=float, default=2_000.0, help="rows/s over all fronts")
    demo.add_argument("--lag-ms", type=int, default=0, help="the last front lags this much")
    demo.add_argument("--stall-after-ms", type=int, help="the last front stalls after this")
    demo.add_argument("--seconds", type=float, default=30.0, help="run time once warm")
    demo.add_argument("--master", default="local[2]")
    demo.set_defaults(handler=main)


def _secret(path: Path | None) -> str | None:
    from lowtide.service import load_secret

    raw = load_secret(path)
    return raw.decode() if raw is not None else None


def main(args: argparse.Namespace) -> int:
    import pyarrow as pa
    import pyarrow.compute as pc

    from lowtide.spark import GeneratorSpec, Pipeline, SessionConfig

    last = args.fronts - 1
    spec = GeneratorSpec(
        fronts=args.fronts, rate=args.rate, payload_bytes=16,
        lag_ms={last: args.lag_ms} if args.lag_ms else {},
        stall={last: (args.stall_after_ms, None)} if args.stall_after_ms is not None else {},
    )
    spark = SessionConfig(master=args.master, app_name="lowtide-spark-demo", ui=False).build()
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
            end = None  # --seconds count once the first batch is done (it starts workers)
            while end is None or time.monotonic() < end:
                time.sleep(1.0)
                if query.exception() is not None:
                    print(f"query failed: {query.exception()}", file=sys.stderr)
                    return 1
                status = query.progress()
                if end is None and status.starting is None:
                    end = time.monotonic() + args.seconds
                print(status.render(pipe.grid.delta_ms), flush=True)
                print()
        finally:
            if query is not None:
                query.stop()
            pipe.close()
            spark.stop()
    return 0
