"""``lowtide serve`` and ``lowtide status``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from lowtide.service.client.status import NoAnswer, answer_wait_s, render, watch
from lowtide.service.deploy.standalone import add_arguments as add_serve_arguments
from lowtide.service.progress import RowRates

PROG = "lowtide status"


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
    if args.once or args.json:
        return _status_once(args)
    console = Console()
    rates = RowRates()  # rows/s from the received totals of successive polls
    wait_s = answer_wait_s(args.interval)  # "connecting to URL (refused)", not a blank
    if not console.is_terminal:  # piped: one rendering after another, no live screen

        def print_each(status: dict[str, Any] | NoAnswer) -> bool:
            console.print(render(status, rates))
            return True

        return watch(PROG, args.url, args.secret_file, print_each, args.interval, wait_s)
    first = render(NoAnswer(args.url, "no connection yet"))
    with Live(first, console=console, auto_refresh=False) as live:

        def show(status: dict[str, Any] | NoAnswer) -> bool:
            live.update(render(status, rates), refresh=True)
            return True

        return watch(PROG, args.url, args.secret_file, show, args.interval, wait_s)


def _status_once(args: argparse.Namespace) -> int:
    got: list[dict[str, Any] | NoAnswer] = []

    def keep(status: dict[str, Any] | NoAnswer) -> bool:
        got.append(status)
        return False  # one is enough

    failed = watch(PROG, args.url, args.secret_file, keep, 0)
    if failed:
        return failed
    if isinstance(got[0], NoAnswer):
        print(got[0].gave_up(PROG), file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(got[0], indent=2))
    else:
        Console().print(render(got[0]))
    return 0
