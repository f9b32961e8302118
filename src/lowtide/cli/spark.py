"""``lowtide demo``, ``lowtide spark demo``, ``lowtide spark status`` and
``lowtide spark class-archive``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

PROG = "lowtide spark status"


def register(subparsers: Any, bench_subparsers: Any) -> None:
    from lowtide.apps import class_archive, demo, progress_demo

    top = subparsers.add_parser(
        "demo", help="exact windows vs a withWatermark query, live view, then JSON"
    )
    demo.add_arguments(top)
    top.set_defaults(handler=demo.main)

    spark = subparsers.add_parser("spark", help="PySpark tracked pipelines")
    sub = spark.add_subparsers(dest="spark_command", metavar="COMMAND")
    progress_demo.add_arguments(
        sub.add_parser("demo", help="run a tracked generator pipeline and show progress"))

    class_archive.add_arguments(sub.add_parser(
        "class-archive", help="write the driver JVM's class archive (make setup runs it)"))

    status = sub.add_parser("status", help="segments, lag, rows/s, stalled fronts, losses")
    status.add_argument("--url", default="tcp://127.0.0.1:7433")
    status.add_argument("--secret-file", type=Path, help="shared secret (else $LOWTIDE_SECRET)")
    status.add_argument("--interval", type=float, default=1.0)
    status.add_argument("--once", action="store_true")
    status.set_defaults(handler=run_status)


def run_status(args: argparse.Namespace) -> int:
    from lowtide.core.time import TimeGrid
    from lowtide.service.client.status import NoAnswer, answer_wait_s, watch
    from lowtide.service.progress import RowRates
    from lowtide.spark.pipeline import status_of

    rates = RowRates()
    unanswered: list[NoAnswer] = []

    def show(doc: dict[str, Any] | NoAnswer) -> bool:
        if isinstance(doc, NoAnswer):
            print(doc.gave_up(PROG) if args.once else doc.line(), file=sys.stderr)
            unanswered.append(doc)
            return not args.once
        grid = TimeGrid(int(doc.get("delta_ms", 10)))
        print(status_of(doc, grid, rates).render(grid.delta_ms), flush=True)
        print()
        return not args.once

    wait_s = 5.0 if args.once else answer_wait_s(args.interval)
    failed = watch(PROG, args.url, args.secret_file, show, args.interval, wait_s)
    return failed or (1 if args.once and unanswered else 0)
