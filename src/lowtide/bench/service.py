"""`lowtide bench service`: agents in separate processes, a real server over loopback.

Workload: a 3-segment chain (src -> mid -> sink). Each agent process is one front; per
round of ``slots`` slots it sends four keyed batches (rule 6) -- items into src, src to
mid, mid to sink, out of sink -- one item per slot, so every batch holds ``slots`` or
``2 * slots`` distinct (segment, window) entries that no merging can shrink. Batches
are built before the clock starts; ``threads`` threads per agent call ``send_batch``
concurrently, as Spark tasks would. Entries/s counts entries the tracker applied.

Notification latency is measured from the moment the last batch of a round is handed
to ``send_batch`` (so it includes the agent, loopback and the server's queue) to the
moment a subscriber in another process receives the min time that covers the round.
It is measured twice: paced (one agent, small rounds, idle machine: what a window
close costs) and under the full throughput load (what queueing adds).

The central deployment runs again with a shared secret (unless ``--no-secret``):
mutual authentication and an HMAC on every frame; the ``secret_*`` figures are what
that costs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.bench.servers import cpu_seconds, serve_subprocess, server_pids
from lowtide.core.acks import child_acks, root_acks
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import AckBatch, Heartbeat, MinTimeUpdate
from lowtide.service import Agent, BatchKey
from lowtide.wire import graph_spec

GRAPH = SegmentGraph.of(("src", ()), ("mid", ("src",)), ("sink", ("mid",)))
START_SLOT = 1_000


@dataclass(frozen=True)
class BenchConfig:
    agents: int = 2
    threads: int = 4
    rounds: int = 40
    slots: int = 2_500
    shards: tuple[int, ...] = (1, 2)
    paced_rounds: int = 300
    paced_every_ms: float = 5.0
    repeat: int = 3
    secret: bool = True  # also measure the central deployment with a shared secret


@dataclass(frozen=True)
class AgentReport:
    entries: int
    start_ns: int
    end_ns: int
    cpu_s: float
    last_send_ns: list[int]  # per round: when its last batch went to send_batch


@dataclass(frozen=True)
class Run:
    """One throughput run: entries/s, latency per round (ms) under that load, and the
    CPU seconds each process spent, which tells what limits the rate."""

    label: str
    entries: int
    seconds: float
    latencies_ms: list[float]
    agent_cpu_s: float
    server_cpu_s: dict[str, float]

    @property
    def rate(self) -> float:
        return self.entries / self.seconds

    @property
    def capacity(self) -> float:
        """Entries per CPU second of the busiest tracker process (shards if any): the
        rate the deployment could reach if CPU were not shared with the agents."""
        shards = [v for k, v in self.server_cpu_s.items() if k.startswith("shard")]
        busiest = max(shards or self.server_cpu_s.values())
        return self.entries / busiest if busiest > 0 else float("nan")


Work = list[tuple[int, BatchKey, AckBatch, tuple[Heartbeat, ...]]]  # (round, key, acks, hbs)


#: the owner name run_fronts registers the fronts with, proven by the agent processes
#: that heartbeat them in their keyed batches (as a Spark source's tasks do)
FRONT_OWNER = "bench-fronts"


def make_rounds(front: int, rounds: int, slots: int, base: int) -> Work:
    """Four batches per round: into src (with the heartbeat), src->mid, mid->sink, out."""
    out: Work = []
    for r in range(rounds):
        times = base + r * slots + np.arange(slots, dtype=np.int64)
        v0 = root_acks(front, np.arange(r * slots, (r + 1) * slots, dtype=np.uint64))
        zero = np.zeros(slots, np.uint64)
        v1, v2 = child_acks(v0, 1, zero), child_acks(child_acks(v0, 1, zero), 2, zero)
        batches = [
            AckBatch.from_columns(0, times, v0, 1),
            AckBatch.concat(
                [AckBatch.from_columns(1, times, v1, 1), AckBatch.from_columns(0, times, v0, -1)]
            ),
            AckBatch.concat(
                [AckBatch.from_columns(2, times, v2, 1), AckBatch.from_columns(1, times, v1, -1)]
            ),
            AckBatch.from_columns(2, times, v2, -1),
        ]
        heartbeat = (Heartbeat(front, base + (r + 1) * slots),)
        for hop, batch in enumerate(batches):
            key = BatchKey("bench", r, f"hop{hop}", front)
            out.append((r, key, batch, heartbeat if hop == 0 else ()))
    return out


def agent_process(
    url: str,
    front: int,
    base: int,
    config: BenchConfig,
    secret: bytes | None,
    go: Any,
    results: Any,
) -> None:
    """One agent: send every batch from ``threads`` threads; report send times."""
    work = make_rounds(front, config.rounds, config.slots, base)
    agent = Agent.connect(url, GRAPH, secret=secret)
    agent.status()  # connected before the clock starts
    last_send = [0] * config.rounds
    lock = threading.Lock()
    queue = iter(work)

    def worker() -> None:
        while True:
            with lock:
                item = next(queue, None)
                if item is None:
                    return
                r, key, acks, hbs = item
                last_send[r] = max(last_send[r], time.monotonic_ns())
            agent.send_batch(key, acks, hbs, owner=FRONT_OWNER)

    threads = [threading.Thread(target=worker) for _ in range(config.threads)]
    go.wait()
    start, cpu = time.monotonic_ns(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = sum(len(b) for _r, _k, b, _h in work)
    end = time.monotonic_ns()
    results.put(AgentReport(entries, start, end, time.process_time() - cpu, last_send))
    agent.close()


@contextmanager
def server(tmp: Path, shards: int, secret: bytes | None = None) -> Iterator[str]:
    """``lowtide serve`` (with ``--shards`` if > 0, with ``secret`` if given) on the
    bench graph, stopped by pid."""
    graph_file = tmp / "graph.json"
    graph_file.write_text(json.dumps(graph_spec(GRAPH)))
    args = ["--graph", str(graph_file), *(["--shards", str(shards)] if shards else [])]
    if secret is not None:
        secret_file = tmp / "secret"
        secret_file.touch(0o600)
        secret_file.write_bytes(secret)
        args += ["--secret-file", str(secret_file)]
    with serve_subprocess(args) as url:
        yield url


class Watch:
    """A subscriber to the global min time that notes when each update arrived."""

    def __init__(self, url: str, secret: bytes | None = None) -> None:
        self.agent = Agent.connect(url, GRAPH, secret=secret)
        self.seen: list[tuple[int, int]] = []
        self.agent.on_update(self._note, None)

    def _note(self, update: MinTimeUpdate) -> None:
        self.seen.append((update.time, time.monotonic_ns()))

    def arrival_ns(self, time_slot: int) -> int | None:
        return next((ns for t, ns in self.seen if t >= time_slot), None)

    def wait_for(self, time_slot: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.arrival_ns(time_slot) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the min time never reached {time_slot}")
            time.sleep(0.002)


@dataclass
class FrontsRun:
    """What :func:`run_fronts` measured; ``watch`` is still connected inside the block."""

    watch: Watch
    reports: list[AgentReport]
    cpu: dict[str, float]  # CPU seconds per server process, start to the final slot


@contextmanager
def run_fronts(
    url: str,
    fronts: range,
    base: int,
    final_slot: int,
    target: Any,
    args: tuple[Any, ...],
    timeout_s: float,
    secret: bytes | None = None,
) -> Iterator[FrontsRun]:
    """One agent process per front, started together by one event: each runs
    ``target(url, front, base, *args, go, results)`` and puts an :class:`AgentReport`.
    Returns once the global min time reaches ``final_slot`` and the fronts are gone."""
    ctx = multiprocessing.get_context("spawn")
    go, results = ctx.Event(), ctx.Queue()
    watch = Watch(url, secret)
    procs: list[Any] = []
    try:
        pids = server_pids(watch.agent)
        for front in fronts:
            watch.agent.register_front(front, "src", base, owner=FRONT_OWNER)
        procs = [
            ctx.Process(target=target, args=(url, f, base, *args, go, results)) for f in fronts
        ]
        for p in procs:
            p.start()
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        go.set()
        reports: list[AgentReport] = [results.get(timeout=timeout_s) for _ in procs]
        watch.wait_for(final_slot, timeout_s)
        cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
        for p in procs:
            p.join(30)
        for front in fronts:  # done: they no longer hold the min time
            watch.agent.unregister_front(front)
        yield FrontsRun(watch, reports, cpu)
    finally:
        for p in procs:  # a failed run must not leave agents behind (nor hang on exit)
            if p.is_alive():
                p.terminate()
                p.join(5)
        watch.agent.close()


def throughput(
    url: str, label: str, config: BenchConfig, attempt: int, secret: bytes | None = None
) -> Run:
    """One run; ``attempt`` k uses fresh fronts and the k-th stretch of slots, so runs
    can follow each other on one server."""
    base = START_SLOT + attempt * config.rounds * config.slots
    fronts = range(attempt * config.agents, (attempt + 1) * config.agents)
    final = base + config.rounds * config.slots
    args = (config, secret)
    with run_fronts(url, fronts, base, final, agent_process, args, 600, secret) as run:
        reports, watch, cpu = run.reports, run.watch, run.cpu
    seconds = (max(r.end_ns for r in reports) - min(r.start_ns for r in reports)) / 1e9
    latencies = []
    for r in range(config.rounds):
        sent = max(rep.last_send_ns[r] for rep in reports)
        arrived = watch.arrival_ns(base + (r + 1) * config.slots)
        if arrived is not None:
            latencies.append((arrived - sent) / 1e6)
    entries = sum(r.entries for r in reports)
    agent_cpu = sum(r.cpu_s for r in reports)
    return Run(label, entries, seconds, latencies, agent_cpu, cpu)


def best_of(url: str, label: str, config: BenchConfig, secret: bytes | None = None) -> Run:
    """The fastest of ``repeat`` runs: other load on the machine only ever slows a run
    down, so the best one is the closest to what the deployment itself can do."""
    runs = [throughput(url, label, config, k, secret) for k in range(config.repeat)]
    return max(runs, key=lambda r: r.rate)


def paced_latency(url: str, config: BenchConfig, secret: bytes | None = None) -> list[float]:
    """One agent, rounds of 10 slots every ``paced_every_ms``: window-close latency."""
    slots, front = 10, 99
    watch = Watch(url, secret)
    out: list[float] = []
    try:
        agent = watch.agent
        base = START_SLOT + config.repeat * config.rounds * config.slots  # after the runs
        agent.register_front(front, "src", base)
        for r in range(config.paced_rounds):
            t = base + r * slots + np.arange(slots, dtype=np.int64)
            v = root_acks(front, np.arange(r * slots, (r + 1) * slots, dtype=np.uint64))
            hb = (Heartbeat(front, base + (r + 1) * slots),)
            agent.send_batch(BatchKey("paced", r, "in", 0), AckBatch.from_columns(0, t, v, 1), hb)
            sent = time.monotonic_ns()  # the last ack of the round goes now
            agent.send_batch(BatchKey("paced", r, "out", 0), AckBatch.from_columns(0, t, v, -1))
            watch.wait_for(base + (r + 1) * slots, 10)
            arrived = watch.arrival_ns(base + (r + 1) * slots)
            assert arrived is not None
            out.append((arrived - sent) / 1e6)
            time.sleep(config.paced_every_ms / 1000)
    finally:
        watch.agent.close()
    return out


@dataclass(frozen=True)
class Secured:
    """The central deployment again, with a shared secret."""

    run: Run
    paced: list[float]


def run(config: BenchConfig) -> dict[str, Any]:
    runs: list[Run] = []
    secured = None
    with tempfile.TemporaryDirectory(prefix="lowtide-bench-") as tmp:
        with server(Path(tmp), 0) as url:
            runs.append(best_of(url, "central", config))
            paced = paced_latency(url, config)
        if config.secret:
            secret = secrets.token_hex(32).encode()
            with server(Path(tmp), 0, secret) as url:
                secured = Secured(
                    best_of(url, "central+secret", config, secret),
                    paced_latency(url, config, secret),
                )
        for n in config.shards:
            with server(Path(tmp), n) as url:
                runs.append(best_of(url, f"{n} shard(s)", config))
    return report(config, paced, runs) | (secret_report(runs[0], paced, secured))


def secret_report(plain: Run, paced: list[float], secured: Secured | None) -> dict[str, Any]:
    """The cost of a shared secret: the central figures with and without."""
    if secured is None:
        return {}
    s = secured.run
    print(
        f"with a shared secret (central): {s.rate:,.0f} entries/s "
        f"({s.rate / plain.rate:.2f} of {plain.rate:,.0f} without), "
        f"loaded p99 {_pct(s.latencies_ms, 99):.2f} ms, server cpu s "
        + ", ".join(f"{k} {v:.2f}" for k, v in s.server_cpu_s.items())
    )
    print(
        f"paced window-close latency with a secret: p50 {_pct(secured.paced, 50):.2f} ms "
        f"(without {_pct(paced, 50):.2f}), p99 {_pct(secured.paced, 99):.2f} ms "
        f"(without {_pct(paced, 99):.2f})"
    )
    return {
        "secret_entries_per_s": round(s.rate),
        "secret_throughput_ratio": round(s.rate / plain.rate, 3),
        "secret_notify_p50_ms": _pct(secured.paced, 50),
        "secret_notify_p99_ms": _pct(secured.paced, 99),
        "secret_loaded_notify_p99_ms": _pct(s.latencies_ms, 99),
        "secret_server_cpu_s": s.server_cpu_s,
    }


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 3) if values else float("nan")


def report(config: BenchConfig, paced: list[float], runs: list[Run]) -> dict[str, Any]:
    print(f"lowtide bench service: {config.agents} agent processes x {config.threads} threads,")
    print(f"{config.rounds} rounds of 4 keyed batches, {config.slots} slots per round, 3 segments,")
    print(f"best of {config.repeat} runs per deployment")
    head = f"{'deployment':<12}{'entries/s':>12}{'wall s':>8}{'p50 ms':>8}{'p99 ms':>8}"
    print(head + f"{'agents cpu s':>14}  server cpu s (per process)")
    for r in runs:
        servers = ", ".join(f"{k} {v:.2f}" for k, v in r.server_cpu_s.items())
        print(
            f"{r.label:<12}{r.rate:>12,.0f}{r.seconds:>8.2f}"
            f"{_pct(r.latencies_ms, 50):>8.2f}{_pct(r.latencies_ms, 99):>8.2f}"
            f"{r.agent_cpu_s:>14.2f}  {servers}"
        )
    print(
        f"paced window-close latency (central, {len(paced)} rounds): "
        f"p50 {_pct(paced, 50):.2f} ms, p99 {_pct(paced, 99):.2f} ms"
    )
    by_label = {r.label: r.rate for r in runs}
    one, two = by_label.get("1 shard(s)"), by_label.get("2 shard(s)")
    capacity = {r.label: r.capacity for r in runs}
    cap_one, cap_two = capacity.get("1 shard(s)"), capacity.get("2 shard(s)")
    print("capacity (entries per CPU second of the busiest tracker process): ", end="")
    print(", ".join(f"{k} {v:,.0f}" for k, v in capacity.items()))
    return {
        "bench": "service",
        "entries_per_s": round(by_label["central"]),
        "notify_p50_ms": _pct(paced, 50),
        "notify_p99_ms": _pct(paced, 99),
        "shard_speedup": round(two / one, 2) if one and two else None,
        "shard_capacity_speedup": round(cap_two / cap_one, 2) if cap_one and cap_two else None,
        "sharded_entries_per_s": {r.label: round(r.rate) for r in runs[1:]},
        "loaded_notify_p99_ms": {r.label: _pct(r.latencies_ms, 99) for r in runs},
        "server_cpu_s": {r.label: r.server_cpu_s for r in runs},
        "agents_cpu_s": {r.label: round(r.agent_cpu_s, 2) for r in runs},
    }


def main(args: argparse.Namespace) -> int:
    config = BenchConfig(
        agents=args.agents,
        threads=args.threads,
        rounds=args.rounds,
        slots=args.slots,
        shards=tuple(int(n) for n in args.shards.split(",") if n),
        paced_rounds=args.paced_rounds,
        repeat=args.repeat,
        secret=args.secret,
    )
    print(json.dumps(run(config)))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    p.add_argument("--agents", type=int, default=d.agents, help="agent processes")
    p.add_argument("--threads", type=int, default=d.threads, help="send_batch threads per agent")
    p.add_argument("--rounds", type=int, default=d.rounds)
    p.add_argument("--slots", type=int, default=d.slots, help="slots (= entries) per round")
    p.add_argument("--shards", default=",".join(map(str, d.shards)), help="e.g. 1,2")
    p.add_argument("--paced-rounds", type=int, default=d.paced_rounds)
    p.add_argument("--repeat", type=int, default=d.repeat, help="runs per deployment, best kept")
    p.add_argument(
        "--no-secret",
        dest="secret",
        action="store_false",
        help="skip the run of the central deployment with a shared secret",
    )
    p.set_defaults(handler=main)


def register(subparsers: Any, bench_subparsers: Any) -> None:
    add_arguments(bench_subparsers.add_parser(
        "service", help="entries/s and notification latency over loopback, 1 and 2 shards"))
