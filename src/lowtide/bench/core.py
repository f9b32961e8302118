"""`lowtide bench core`: ack entries applied per second by the core, central and sharded.

The workload is a 3-segment chain (src -> mid -> sink). Each batch holds ``batch``
entries: items enter ``src`` and move one segment on per batch, so every batch mixes
sends, receives and several windows, and the min times keep advancing. Batches are
built before the clock starts; the timed part is validation + apply + step.

Sharded figures run every shard in this one process: they measure the cost of routing,
node times and aggregation, not a parallel speed-up (that is ``lowtide bench service``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import numpy as np

from lowtide.core.acks import child_acks, root_acks
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import AckBatch, Flush, Heartbeat, RegisterFront
from lowtide.core.sharding import ShardAggregator, ShardLayout, ShardRouter, TrackerShard
from lowtide.core.time import TimeGrid
from lowtide.core.tracker import TrackerConfig

GRAPH = SegmentGraph.of(("src", ()), ("mid", ("src",)), ("sink", ("mid",)))
HOPS = len(GRAPH)  # entries per item per hop: a send into the next segment, a receive


@dataclass(frozen=True)
class Workload:
    batches: list[AckBatch]
    heartbeats: list[int]
    entries: int


def make_workload(n_batches: int, batch: int, slots_per_batch: int = 4) -> Workload:
    """Batches where each item is sent into src, then relayed by one segment per batch."""
    items = batch // (2 * HOPS)  # each item contributes 2 entries per hop over HOPS batches
    rng = np.random.default_rng(7)
    out: list[AckBatch] = []
    heartbeats: list[int] = []
    waves: list[tuple[np.ndarray, np.ndarray]] = []  # (times, acks) of items per hop age
    seq = 0
    for b in range(n_batches):
        base = b * slots_per_batch
        times = base + np.sort(rng.integers(0, slots_per_batch, items)).astype(np.int64)
        acks = root_acks(1, np.arange(seq, seq + items, dtype=np.uint64))
        seq += items
        waves.insert(0, (times, acks))
        parts = [AckBatch.from_columns(0, times, acks, 1)]
        for hop, (t, a) in enumerate(waves[1 : HOPS + 1], start=1):
            if hop < HOPS:  # relay from segment hop-1 into segment hop: child first
                child = child_acks(a, hop, np.zeros(len(a), np.uint64))
                parts.append(AckBatch.from_columns(hop, t, child, 1))
                waves[hop] = (t, child)
            parts.append(AckBatch.from_columns(hop - 1, t, a, -1))
        del waves[HOPS:]
        out.append(AckBatch.concat(parts))
        heartbeats.append(base + slots_per_batch)
    return Workload(out, heartbeats, sum(len(b) for b in out))


def run_central(w: Workload) -> tuple[float, list[float], int]:
    tracker = TrackerConfig(GRAPH, TimeGrid()).build()
    tracker.register_front(RegisterFront(1, "src", 0))
    lat: list[float] = []
    start = time.perf_counter()
    for acks, hb in zip(w.batches, w.heartbeats, strict=True):
        t0 = time.perf_counter()
        tracker.apply_flush(acks, (Heartbeat(1, hb),))
        tracker.step(0)
        lat.append(time.perf_counter() - t0)
    return time.perf_counter() - start, lat, tracker.min_time()


def run_sharded(w: Workload, n_shards: int) -> tuple[float, int]:
    layout = ShardLayout(n_shards, 1)
    config = TrackerConfig(GRAPH, TimeGrid())
    shards = [TrackerShard(config, layout, k) for k in range(n_shards)]
    for shard in shards:
        shard.register_front(RegisterFront(1, "src", 0))
    router, agg = ShardRouter(layout, node=1), ShardAggregator(GRAPH, n_shards)
    start = time.perf_counter()
    for i, (acks, hb) in enumerate(zip(w.batches, w.heartbeats, strict=True)):
        for part in router.route(Flush(1, i, acks, (Heartbeat(1, hb),))):
            shard = shards[part.shard]
            shard.receive(part)
            report = shard.step(0)
            if report is not None:
                agg.receive(report)
        if i % 64 == 0:
            for shard in shards:
                shard.release(agg.release())
    return time.perf_counter() - start, agg.min_time()


def main(args: argparse.Namespace) -> int:
    w = make_workload(args.batches, args.batch)
    run_central(make_workload(50, args.batch))  # warm-up: numpy code paths, allocations
    elapsed, lat, final = run_central(w)
    acks_per_s = w.entries / elapsed
    p50, p99 = (float(np.percentile(lat, q)) * 1e6 for q in (50, 99))
    print(f"core tracker, {len(w.batches)} batches of ~{args.batch} ack entries, 3 segments")
    print(f"last heartbeat {w.heartbeats[-1]}; final global min time is shown per mode")
    print(f"{'mode':<12}{'entries/s':>14}{'p50 us':>10}{'p99 us':>10}{'min time':>10}")
    print(f"{'central':<12}{acks_per_s:>14,.0f}{p50:>10.1f}{p99:>10.1f}{final:>10}")
    shards = {}
    for n in (1, 2, 4):
        took, final = run_sharded(w, n)
        shards[str(n)] = w.entries / took
        print(f"{f'{n} shard(s)':<12}{shards[str(n)]:>14,.0f}{'':>10}{'':>10}{final:>10}")
    figures = {
        "bench": "core",
        "acks_per_s": round(acks_per_s),
        "p50_apply_us": round(p50, 1),
        "p99_apply_us": round(p99, 1),
        "shards": {n: round(r) for n, r in shards.items()},
    }
    print(json.dumps(figures))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batches", type=int, default=2_000, help="batches to apply (default 2000)")
    p.add_argument("--batch", type=int, default=1_000, help="ack entries per batch")
    p.set_defaults(handler=main)


def register(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    add_arguments(bench.add_parser("core", help="ack entries/s and per-batch latency of the core"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m lowtide.bench.core")
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
