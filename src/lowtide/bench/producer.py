"""``lowtide bench producer``: what durable send-acks cost a producer.

A ``lowtide.Front`` labels batches of records against a standalone tracker (``lowtide
serve`` with a state dir, in a subprocess on loopback), with ``confirm=True`` (the
default: :meth:`Front.label` returns once the tracker has logged the send-acks) and
``confirm=False`` (the agent buffers them for up to ``max_age_ms``), alternating in
one run, at several batch sizes. Records/s of label + written, nothing else (the
producer's own write is left out: it is the same either way). Human table, then one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lowtide.bench.chaos.tracker import TrackerProcess
from lowtide.bench.chaos.workload import GRAPH
from lowtide.core.time import TimeGrid
from lowtide.spark.sources import Front
from lowtide.spark.tracking import TrackerRef

VARIANTS = {"durable": True, "buffered": False}


def measure(ref: TrackerRef, front: int, confirm: bool, batch: int, seconds: float) -> float:
    """Records/s one front labels (and marks written) for ``seconds``."""
    producer = Front(None, front, ref, segment="src", confirm=confirm, heartbeat_ms=20,
                     owner=f"bench-producer-{front}")
    records = [b"x" * 100] * batch
    n, start = 0, time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            producer.written(producer.label(records))
            n += batch
        producer.flush()  # the buffered variant's last acks count too
        return n / (time.perf_counter() - start)
    finally:
        producer.close(unregister=True)


def run(batches: list[int], rounds: int, seconds: float) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="lowtide-producer-") as tmp:
        tracker = TrackerProcess(Path(tmp))
        if not tracker.start():
            raise RuntimeError(f"the tracker did not start: see {tracker.log_path}")
        try:
            ref = TrackerRef(tracker.url, GRAPH, TimeGrid())
            front = 0
            for batch in batches:
                figures = out.setdefault(str(batch), {v: [] for v in VARIANTS})
                for _round in range(rounds):  # alternating: load drifts hit both alike
                    for name, confirm in VARIANTS.items():
                        front += 1
                        figures[name].append(measure(ref, front, confirm, batch, seconds))
        finally:
            tracker.kill9()
    return out


def summary(results: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    rows = {}
    for batch, figures in results.items():
        durable = statistics.median(figures["durable"])
        buffered = statistics.median(figures["buffered"])
        rows[batch] = {"durable_records_per_s": round(durable),
                       "buffered_records_per_s": round(buffered),
                       "durable_over_buffered": round(durable / buffered, 3)}
    return {"bench": "producer", "batches": rows}


def main(args: argparse.Namespace) -> int:
    batches = [int(b) for b in args.batches.split(",")]
    figures = summary(run(batches, args.rounds, args.seconds))
    print(f"{'records per label':>17} {'durable rec/s':>14} {'buffered rec/s':>15} {'ratio':>6}")
    for batch, row in figures["batches"].items():
        print(f"{batch:>17} {row['durable_records_per_s']:>14} "
              f"{row['buffered_records_per_s']:>15} {row['durable_over_buffered']:>6}")
    print(json.dumps(figures))
    return 0


def register(subparsers: Any, bench_subparsers: Any) -> None:
    p = bench_subparsers.add_parser(
        "producer", help="a Front's records/s with durable and buffered send-acks")
    p.add_argument("--batches", default="1,100,1000", help="records per label, comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per variant")
    p.add_argument("--seconds", type=float, default=2.0, help="per round and variant")
    p.set_defaults(handler=main)
