"""`lowtide` command line. Each area adds its own sub-commands through ``register``.

Areas are imported lazily so ``lowtide bench core`` works with the core install alone,
and a missing extra is reported as a one-line hint instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from lowtide import LowtideError, __version__

# (module, the extra that provides its dependencies); each has register(subparsers, bench).
AREAS: tuple[tuple[str, str], ...] = (
    ("lowtide.cli.service", "lowtide[service]"),
    ("lowtide.cli.spark", "lowtide[spark]"),
    ("lowtide.cli.recovery", "lowtide[spark]"),
    ("lowtide.apps.walkthrough", ""),
    ("lowtide.apps.kafka_broker", ""),
    ("lowtide.apps.retention_report", ""),
    ("lowtide.bench.core", ""),
    ("lowtide.bench.service", "lowtide[service]"),
    ("lowtide.bench.spark", "lowtide[spark]"),
    ("lowtide.bench.sim", ""),
    ("lowtide.bench.capacity", "lowtide[service]"),
    ("lowtide.bench.rr", "lowtide[spark]"),
    ("lowtide.bench.sweep", "lowtide[spark]"),
    ("lowtide.bench.keys", "lowtide[spark]"),
    ("lowtide.bench.chaos", "lowtide[service]"),
    ("lowtide.bench.recovery", "lowtide[spark]"),
    ("lowtide.bench.producer", "lowtide[service]"),
    ("lowtide.bench.paper", "lowtide[bench]"),
)

Handler = Callable[[argparse.Namespace], int]


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line that says where the fix is, not the whole usage
    (sub-commands' parsers are of this class too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="lowtide", description="Exact progress tracking for PySpark streaming pipelines."
    )
    parser.add_argument("--version", action="version", version=f"lowtide {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench = sub.add_parser("bench", help="benchmarks: human table, then one JSON line")
    bench_sub = bench.add_subparsers(dest="bench", metavar="BENCH")
    missing = []
    for module, extra in AREAS:
        try:  # register may import more of the area (lazily, for start-up time)
            importlib.import_module(module).register(sub, bench_sub)
        except ModuleNotFoundError as exc:
            package = (exc.name or "?").split(".")[0]
            missing.append(f"{module} needs {package!r}: pip install '{extra}'")
    if missing:
        parser.epilog = "unavailable here: " + "; ".join(missing)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except LowtideError as err:  # lowtide's own errors are one line, no traceback
        print(f"lowtide {args.command}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
