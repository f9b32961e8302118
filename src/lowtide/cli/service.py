"""``lowtide serve`` and ``lowtide status``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from lowtide.service.progress import RowRates
from lowtide.service.standalone import add_arguments as add_serve_arguments
from lowtide.service.status import render, watch


def register(subparsers: Any, bench_subparsers: Any) -> None:
    add_serve_arguments(subparsers.add_parser("serve", help="run a standalone tracker server"))

    status = subparsers.add_parser("status", help="live table of a tracker's segments")
    status.add_argument("--url", default="tcp://127.0.0.1:7433")
    status.add_argument("--secret-file", type=Path, help="shared secret (else $LOWTIDE_SECRET)")
    status.add_argument("--interval", type=float, default=1.0, help="seconds between updates")
    status.add_argument("--once", action="store_true", help="print one table and exit")
    status.add_argument("--json", action="store_true", help="print the status as JSON, once")
    status.set_defaults(handler=run_status)


def run_status(args: argparse.Namespace) -> int:
    console = Console()
    rates = RowRates()  # rows/s from the received totals of successive polls
    if args.once or args.json:
        got: list[dict[str, Any] | None] = []

        def keep(status: dict[str, Any] | None) -> bool:
            got.append(status)
            return False  # one is enough

        failed = watch("lowtide status", args.url, args.secret_file, keep, 0)
        if failed:
            return failed
        if got[0] is None:
            print(f"lowtide status: no answer from {args.url}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(got[0], indent=2))
        else:
            console.print(render(got[0], args.url))
        return 0
    with Live(render(None, args.url), console=console, auto_refresh=False) as live:

        def show(status: dict[str, Any] | None) -> bool:
            live.update(render(status, args.url, rates), refresh=True)
            return True

        return watch("lowtide status", args.url, args.secret_file, show, args.interval)
