"""``lowtide serve`` and ``lowtide status``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from lowtide.service.auth import load_secret
from lowtide.service.lane import LaneConfig
from lowtide.service.progress import RowRates
from lowtide.service.standalone import add_arguments as add_serve_arguments
from lowtide.service.status import poll_status, render


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
    lane = LaneConfig(secret=load_secret(args.secret_file), connect_timeout_s=5.0)
    console = Console()
    rates = RowRates()  # rows/s from the received totals of successive polls
    if args.once or args.json:
        got: list[dict[str, Any] | None] = []

        def keep(status: dict[str, Any] | None) -> bool:
            got.append(status)
            return False  # one is enough

        asyncio.run(poll_status(args.url, lane, keep, 0, 5.0))
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

        asyncio.run(poll_status(args.url, lane, show, args.interval, 5.0))
    return 0
