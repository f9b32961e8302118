"""``lowtide replay`` and ``lowtide cut``: recovery from the command line
(docs/operating.md).

``lowtide replay --status S --log DIR`` prints, per stuck window with missing items,
the (front, offsets) of the ingest log to replay (no Spark). With ``--app
module:function`` (a function of a SparkSession returning the query's ``Stream``,
described on a ``Pipeline`` whose ``tracker=`` is the running tracker) it replays: a
time range into a fresh output (``--from --to --out``), or the stuck windows of the
sink into the output they are missing from (``--repair --output PATH``).

``lowtide cut --as-of T --table PATH ...`` writes the manifest of a consistent cut:
for every table, the committed batches and files holding its rows below ``T``; refused
(one line, exit 1) when a table has not reached ``T``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any


def register(subparsers: Any, bench_subparsers: Any) -> None:
    replay = subparsers.add_parser("replay", help="the log offsets of a loss; replay a time "
                                   "range or the stuck windows (docs/operating.md)")
    replay.add_argument("--status", help="`lowtide status --json` output: a file, or - "
                        "(default: ask the tracker at --url)")
    replay.add_argument("--url", default="tcp://127.0.0.1:7433")
    replay.add_argument("--secret-file", type=Path, help="shared secret (else $LOWTIDE_SECRET)")
    replay.add_argument("--log", help="the ingest log directory (to locate a loss)")
    replay.add_argument("--app", help="module:function(spark) -> the query's Stream")
    replay.add_argument("--sink", default="sink", help="the query's sink name")
    replay.add_argument("--from", dest="from_time", help="ISO timestamp or epoch ms")
    replay.add_argument("--to", dest="to_time", help="ISO timestamp or epoch ms")
    replay.add_argument("--out", help="a fresh folder for the replayed rows (Parquet)")
    replay.add_argument("--repair", action="store_true",
                        help="complete the sink's stuck windows in --output")
    replay.add_argument("--output", help="the sink's output (what --repair completes)")
    replay.add_argument("--format", default="parquet", choices=("parquet", "delta"))
    replay.add_argument("--settle-s", type=float, default=5.0, help="--repair: how long "
                        "the stuck windows must stay the same (above your longest batch)")
    replay.set_defaults(handler=run_replay)

    cut = subparsers.add_parser("cut", help="manifest of a consistent cut of tracked tables")
    cut.add_argument("--as-of", help="ISO timestamp or epoch ms (required)")
    cut.add_argument("--table", action="append", help="a tracked table (required; repeat)")
    cut.add_argument("--delta-ms", type=int, help="slot width (default: the tables')")
    cut.add_argument("--out", help="write the manifest here (default: stdout)")
    cut.set_defaults(handler=run_cut)


def time_arg(text: str) -> int | datetime:
    """Epoch ms, or an ISO timestamp (UTC if it names no zone)."""
    if text.isdigit():
        return int(text)
    from datetime import UTC

    when = datetime.fromisoformat(text)
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _status(args: argparse.Namespace) -> dict[str, Any]:
    if args.status:
        with sys.stdin if args.status == "-" else open(args.status) as f:
            doc: dict[str, Any] = json.load(f)
            return doc
    from lowtide.service.client.status import NoAnswer, watch

    got: list[Any] = []

    def keep(status: Any) -> bool:
        got.append(status)
        return False  # one is enough

    failed = watch("lowtide replay", args.url, args.secret_file, keep, 0)
    if failed or not got or isinstance(got[0], NoAnswer):
        raise SystemExit(f"lowtide replay: no answer from {args.url}: pass --status or --url")
    return dict(got[0])


def _app(spec: str, delta: bool) -> Any:
    module, _, name = spec.partition(":")
    if not name:
        raise SystemExit(f"lowtide replay: --app {spec!r}: write module:function")
    from lowtide.spark.session import SessionConfig

    spark = SessionConfig(delta=delta).build()
    return getattr(importlib.import_module(module), name)(spark)


def run_replay(args: argparse.Namespace) -> int:
    from lowtide.core.time import TimeGrid
    from lowtide.spark.pipeline.replay import losses

    if args.app is None:
        if not args.log:
            raise SystemExit("lowtide replay: pass --log DIR (locate) or --app (replay)")
        status = _status(args)
        found = losses(status, args.log)
        grid = TimeGrid(int(status.get("delta_ms", 10)))
        for loss in found:
            print(loss.describe(grid))
        print(json.dumps({"losses": [{"segment": x.segment, "start": x.start, "end": x.end,
                                      "missing": x.missing,
                                      "offsets": {str(f): list(o) for f, o in x.offsets.items()}}
                                     for x in found]}))
        return 0
    return _replay_app(args)


def _replay_app(args: argparse.Namespace) -> int:
    from lowtide.spark.pipeline.repair import Output, Target, repair
    from lowtide.spark.pipeline.replay import replay

    stream = _app(args.app, args.format == "delta")
    pipe = stream.pipeline
    pipe.start_tracker(stream.graph(args.sink))
    try:
        if args.repair:
            if not args.output:
                raise SystemExit("lowtide replay --repair: pass --output PATH (its rows)")
            target = Target(pipe, stream, args.sink, Output(args.output, args.format))
            done = repair(target, settle_s=args.settle_s)
            print(json.dumps({"repaired_windows": len(done.losses), "rows": done.rows}))
            return 0
        if not (args.from_time and args.to_time and args.out):
            raise SystemExit("lowtide replay --app: pass --from, --to and --out (or --repair)")
        got = replay(pipe, stream, time_arg(args.from_time), time_arg(args.to_time), args.out,
                     sink=args.sink)
        print(json.dumps({"out": got.path, "from_slot": got.from_slot, "to_slot": got.to_slot,
                          "offsets": {str(f): list(o) for f, o in got.offsets.items()}}))
        return 0
    finally:
        pipe.close()


def run_cut(args: argparse.Namespace) -> int:
    from lowtide.spark.sinks.cuts import cut, delta_ms_of, slot_of_ms

    if not (args.as_of and args.table):
        raise SystemExit("lowtide cut: pass --as-of T and one --table PATH per table")
    delta_ms = args.delta_ms or delta_ms_of(args.table[0])
    manifest = cut(args.table, slot_of_ms(time_arg(args.as_of), delta_ms), delta_ms=delta_ms)
    text = json.dumps(manifest.doc(), indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
        print(json.dumps({"manifest": args.out, "sinks": len(manifest.sinks),
                          "rows": sum(s.rows for s in manifest.sinks)}))
    else:
        print(text)
    return 0
