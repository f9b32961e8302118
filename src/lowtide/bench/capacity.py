"""`lowtide bench capacity`: tracker capacity with the ack load multiplied (paper,
"Scalability"): 1x, 5x, 9x, 17x acks per item, central tracker vs 2 shards.

The paper could not overload its central tracker with 100 machines, so it multiplied
the Ack messages. Here a fixed item rate is offered by agent processes (one front
each) on the 3-segment chain of ``lowtide bench service``; every batch a hop would
send is split into ``m`` batches whose XORs combine to the original (the counts ride
on the first piece), so the tracker gets ``m`` times the messages and entries for the
same items and the same min times. Each (hop, front) is one sender thread, sending its
pieces in order as one operator instance would; the heartbeat of a round rides on the
round's last piece into ``src`` (rule 3).

Per multiplier and deployment it reports the entries the tracker applied per second,
the notification latency per round (from the moment the round's last batch was handed
to ``send_batch`` to the moment a subscriber in this process got the min time covering
it), how far each notification trailed the round's schedule (backlog: it grows when the
tracker does not keep up), and the tracker's CPU seconds per million entries.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.bench.service import (
    FRONT_OWNER,
    GRAPH,
    START_SLOT,
    AgentReport,
    Watch,
    make_rounds,
    run_fronts,
    server,
)
from lowtide.bench.stats import percentile
from lowtide.core.acks import splitmix64
from lowtide.core.messages import AckBatch, Heartbeat
from lowtide.service import Agent, BatchKey

ENTRIES_PER_ITEM = 6  # 3 segments, each item acked into and out of each
HOPS = 4  # batches per round at 1x: into src, src->mid, mid->sink, out of sink
MULTIPLIERS = (1, 5, 9, 17)
# A point kept up if its notifications trailed their schedule no more at the end than at
# the start: medians of the first and last quarter of rounds, so that one stall of the
# shared machine (which also shows in items/s) does not count, a growing backlog does.
KEPT_UP_GROWTH_MS = 100.0


@dataclass(frozen=True)
class CapacityConfig:
    multipliers: tuple[int, ...] = MULTIPLIERS
    shards: tuple[int, ...] = (0, 2)  # 0: the central tracker
    agents: int = 2
    items_per_s: float = 20_000.0  # the paper's central capacity
    round_ms: float = 50.0
    seconds: float = 8.0
    drain_timeout_s: float = 120.0

    @property
    def slots(self) -> int:
        """Items per round per agent (one per slot, so merging cannot shrink them)."""
        return max(1, round(self.items_per_s * self.round_ms / 1000 / self.agents))

    @property
    def rounds(self) -> int:
        return max(2, round(self.seconds * 1000 / self.round_ms))

    @property
    def offered_items_per_s(self) -> float:
        return self.agents * self.slots * 1000 / self.round_ms


QUICK = CapacityConfig(seconds=4.0, drain_timeout_s=60.0)


def label_of(shards: int) -> str:
    return "central" if shards == 0 else f"{shards} shards"


# ------------------------------------------------------------------ agent side
def split(batch: AckBatch, m: int, salt: int) -> list[AckBatch]:
    """``m`` batches whose XORs per row combine to ``batch``'s; counts on the first.

    >>> b = AckBatch.from_columns(0, [5, 6], [7, 9], 1)
    >>> parts = split(b, 3, salt=1)
    >>> [int(x) for x in parts[0].xor ^ parts[1].xor ^ parts[2].xor]
    [7, 9]
    >>> [int(p.count.sum()) for p in parts]
    [2, 0, 0]
    """
    zero = np.zeros(len(batch), np.int64)
    out, rest = [], batch.xor.copy()
    for k in range(m - 1):
        piece = splitmix64(batch.xor ^ np.uint64(salt * 64 + k))
        rest ^= piece
        out.append(AckBatch(batch.segment, batch.time, piece, batch.count if k == 0 else zero))
    out.append(AckBatch(batch.segment, batch.time, rest, batch.count if m == 1 else zero))
    return out


class RoundSender:
    """One agent process's senders: a thread per hop, fed round by round on schedule."""

    def __init__(self, agent: Agent, front: int, base: int, config: CapacityConfig, m: int):
        self.agent, self.front, self.base, self.config, self.m = agent, front, base, config, m
        self.queues: list[queue.Queue[tuple[int, BatchKey, AckBatch, int] | None]] = [
            queue.Queue() for _ in range(HOPS)
        ]
        self.last_send = [[0] * config.rounds for _ in range(HOPS)]  # one writer per row
        self.entries = 0

    def pieces(self, r: int) -> list[list[tuple[int, BatchKey, AckBatch, int]]]:
        """Round ``r``'s batches per hop: (round, key, acks, heartbeat time or 0)."""
        slots = self.config.slots
        hops = make_rounds(self.front, 1, slots, self.base + r * slots)
        out = []
        for hop, (_r, _key, batch, _hbs) in enumerate(hops):
            parts = split(batch, self.m, salt=r * HOPS + hop)
            last_hb = self.base + (r + 1) * slots if hop == 0 else 0
            out.append(
                [
                    (
                        r,
                        BatchKey("capacity", r * self.m + k, f"hop{hop}", self.front),
                        part,
                        last_hb if k == self.m - 1 else 0,
                    )
                    for k, part in enumerate(parts)
                ]
            )
            self.entries += sum(len(p) for p in parts)
        return out

    def send(self, hop: int) -> None:
        while (item := self.queues[hop].get()) is not None:
            r, key, acks, hb = item
            self.last_send[hop][r] = time.monotonic_ns()
            self.agent.send_batch(key, acks, (Heartbeat(self.front, hb),) if hb else (),
                                  owner=FRONT_OWNER)

    def run(self, start_ns: int) -> None:
        threads = [threading.Thread(target=self.send, args=(h,)) for h in range(HOPS)]
        for t in threads:
            t.start()
        round_ns = int(self.config.round_ms * 1e6)
        for r in range(self.config.rounds):
            delay_ns = start_ns + r * round_ns - time.monotonic_ns()
            if delay_ns > 0:
                time.sleep(delay_ns / 1e9)
            for hop, items in enumerate(self.pieces(r)):
                for item in items:
                    self.queues[hop].put(item)
        for q in self.queues:
            q.put(None)
        for t in threads:
            t.join()


def agent_process(
    url: str, front: int, base: int, config: CapacityConfig, m: int, go: Any, results: Any
) -> None:
    agent = Agent.connect(url, GRAPH)
    try:
        agent.status()  # connected before the clock starts
        sender = RoundSender(agent, front, base, config, m)
        go.wait()
        start, cpu = time.monotonic_ns(), time.process_time()
        sender.run(start)
        last = [max(col) for col in zip(*sender.last_send, strict=True)]
        end = time.monotonic_ns()
        results.put(AgentReport(sender.entries, start, end, time.process_time() - cpu, last))
    finally:
        agent.close()


# ------------------------------------------------------------------ one run
def applied_total(watch: Watch, want: int, timeout_s: float = 15.0) -> int:
    """The server's applied entries once they reach ``want`` (a coordinator learns
    its shards' counts once a second), or what they are at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        total = int(watch.agent.status().get("acks_applied", 0))
        if total >= want or time.monotonic() > deadline:
            return total
        time.sleep(0.1)


def measure(
    url: str, shards: int, config: CapacityConfig, m: int, attempt: int, applied_before: int
) -> dict[str, Any]:
    """One multiplier on a running deployment; ``attempt`` k uses fresh fronts and the
    k-th stretch of slots, so runs can follow each other on one server."""
    base = START_SLOT + attempt * config.rounds * config.slots
    fronts = range(attempt * config.agents, (attempt + 1) * config.agents)
    final = base + config.rounds * config.slots
    timeout_s = config.seconds + config.drain_timeout_s
    with run_fronts(url, fronts, base, final, agent_process, (config, m), timeout_s) as run:
        reports, watch, cpu = run.reports, run.watch, run.cpu
        sent = sum(r.entries for r in reports)
        applied = applied_total(watch, applied_before + sent) - applied_before
    return summarize(config, shards, m, base, reports, watch, cpu, sent, applied)


def summarize(
    config: CapacityConfig,
    shards: int,
    m: int,
    base: int,
    reports: list[AgentReport],
    watch: Watch,
    cpu: dict[str, float],
    sent: int,
    applied: int,
) -> dict[str, Any]:
    start = min(r.start_ns for r in reports)
    round_ns = config.round_ms * 1e6
    latencies, lags = [], []
    for r in range(config.rounds):
        arrived = watch.arrival_ns(base + (r + 1) * config.slots)
        if arrived is None:
            continue
        latencies.append((arrived - max(rep.last_send_ns[r] for rep in reports)) / 1e6)
        lags.append((arrived - start - (r + 1) * round_ns) / 1e6)
    final = watch.arrival_ns(base + config.rounds * config.slots) or time.monotonic_ns()
    # the offered stretch at least: the last round's items stand for its whole round
    seconds = max(final - start, config.rounds * round_ns) / 1e9
    items = config.rounds * config.slots * config.agents
    quarter = max(1, len(lags) // 4)
    growth = float(np.median(lags[-quarter:]) - np.median(lags[:quarter]))
    tracker_cpu = sum(cpu.values())
    # the coordinator may not have named its shards' pids in time: then all processes
    busiest = max([v for k, v in cpu.items() if k.startswith("shard")] or cpu.values())
    items_per_s = items / seconds
    return {
        "deployment": label_of(shards),
        "multiplier": m,
        "offered_items_per_s": round(config.offered_items_per_s),
        "items_per_s": round(items_per_s),
        "batches_sent": config.rounds * config.agents * HOPS * m,
        "entries_sent": sent,
        "entries_applied": applied,
        "entries_per_s": round(applied / seconds),
        "seconds": round(seconds, 3),
        "notify_p50_ms": percentile(latencies, 50),
        "notify_p99_ms": percentile(latencies, 99),
        "backlog_growth_ms": round(growth, 1),
        "kept_up": growth < KEPT_UP_GROWTH_MS,
        "tracker_cpu_s": {k: round(v, 3) for k, v in cpu.items()},
        "agents_cpu_s": round(sum(r.cpu_s for r in reports), 3),
        "tracker_cpu_s_per_m_entries": round(tracker_cpu / applied * 1e6, 3) if applied else None,
        # the item rate if each tracker process had a core of its own (the paper's setup)
        "capacity_items_per_s": round(items / busiest) if busiest > 0 else None,
    }


# ------------------------------------------------------------------ the bench
def run(quick: bool, config: CapacityConfig | None = None) -> dict[str, Any]:
    config = config or (QUICK if quick else CapacityConfig())
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="lowtide-capacity-") as tmp:
        for shards in config.shards:
            with server(Path(tmp), shards) as url:
                applied = 0
                for attempt, m in enumerate(config.multipliers):
                    print(f"[capacity] {label_of(shards)}, {m}x acks", file=sys.stderr, flush=True)
                    one = measure(url, shards, config, m, attempt, applied)
                    applied += one["entries_applied"]
                    runs.append(one)
    params = asdict(config)
    params["slots_per_round"] = config.slots
    return {"bench": "capacity", "quick": quick, "config": params, "runs": runs}


def print_table(result: dict[str, Any]) -> None:
    cfg = result["config"]
    print(
        f"lowtide bench capacity: {cfg['agents']} agent processes, offered "
        f"{cfg['agents'] * cfg['slots_per_round'] * 1000 / cfg['round_ms']:,.0f} items/s "
        f"({cfg['slots_per_round']} items per agent every {cfg['round_ms']:g} ms) for "
        f"{cfg['seconds']:g} s; {ENTRIES_PER_ITEM} entries per item at 1x"
    )
    head = f"{'deployment':<10}{'acks':>5}{'items/s':>9}{'entries/s':>11}{'p50 ms':>8}"
    print(head + f"{'p99 ms':>8}{'growth ms':>10}{'kept up':>8}{'cpu s/M':>8}{'cap items/s':>12}")
    for r in result["runs"]:
        print(
            f"{r['deployment']:<10}{str(r['multiplier']) + 'x':>5}{r['items_per_s']:>9,}"
            f"{r['entries_per_s']:>11,}{cell(r['notify_p50_ms']):>8}{cell(r['notify_p99_ms']):>8}"
            f"{r['backlog_growth_ms']:>10.1f}{'yes' if r['kept_up'] else 'NO':>8}"
            f"{cell(r['tracker_cpu_s_per_m_entries']):>8}{r['capacity_items_per_s'] or 0:>12,}"
        )
    print("cpu s/M: tracker CPU seconds (all its processes) per million entries applied;")
    print("cap items/s: items per CPU second of the busiest tracker process.")


def cell(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


# ------------------------------------------------------------------ command
def add_arguments(p: argparse.ArgumentParser) -> None:
    d = CapacityConfig()
    p.add_argument("--quick", action="store_true", help="short runs (about 1-2 minutes)")
    p.add_argument("--multipliers", default=",".join(map(str, d.multipliers)))
    p.add_argument("--shards", default=",".join(map(str, d.shards)), help="0 = central")
    p.add_argument("--agents", type=int, default=d.agents, help="agent processes (fronts)")
    p.add_argument("--items-per-s", type=float, default=d.items_per_s, help="offered rate")
    p.add_argument("--round-ms", type=float, default=d.round_ms)
    p.add_argument("--seconds", type=float, help="per point (default 8, quick 4)")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    base = QUICK if args.quick else CapacityConfig()
    config = replace(
        base,
        multipliers=tuple(int(m) for m in args.multipliers.split(",") if m),
        shards=tuple(int(n) for n in args.shards.split(",") if n),
        agents=args.agents,
        items_per_s=args.items_per_s,
        round_ms=args.round_ms,
        seconds=args.seconds if args.seconds is not None else base.seconds,
    )
    result = run(args.quick, config)
    print_table(result)
    print(json.dumps(result))
    return 0


def register(subparsers: Any, bench_subparsers: Any) -> None:
    add_arguments(
        bench_subparsers.add_parser(
            "capacity", help="tracker capacity with 1x-17x acks per item, central vs 2 shards"
        )
    )


if __name__ == "__main__":  # without the other areas: python -m lowtide.bench.capacity
    _parser = argparse.ArgumentParser(prog="python -m lowtide.bench.capacity")
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
