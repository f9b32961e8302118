"""``lowtide bench chaos``: the one promise under faults and hostile peers.

Each scenario runs a standalone tracker (``lowtide serve`` with a state dir and a
secret) and good clients whose ground truth is known (see :mod:`.workload`), injects
its faults (:mod:`.faults`, :mod:`.hostile`; a producer killed while its front joins
a query attached to its topic: :mod:`.join_fault`) and counts:

* ``premature``: notifications that claimed a time while an item below it was still
  in flight (must be 0), and agents fooled by a server without the secret;
* ``lost``: runs whose sink never reached the end after recovery, or whose good client
  was kept out ("first handshake cut") (must be 0): a front
  that went silent for good ("dead front") is retired by ``--dead-fronts retire``;
* ``false_loss_reports``: stuck windows the tracker reported (nothing is ever lost
  here; "slow batch" runs the consumer's batches 4x past ``--stuck-after-ms``);
* refused starts: a tracker that would not recover from a damaged log (the safe
  answer; the scenario then restores the state dir, the documented way out);
* the good clients' notification delay, quiet and under attack.

Human table, then one JSON line; ``--quick`` runs in under five minutes. ``--spark``
adds the fault kinds that need real Spark queries and files (:mod:`.spark_faults`:
reruns from a new checkpoint into every file sink, two writers of one Delta table, rows
lost in a step and replayed by time, a retry loop under a task failure and a restart:
:mod:`.retry_fault`, a speculative window under task failures and a restart, and one
on the driver under a sink failure: :mod:`.speculative_fault`, a key-range window on
the driver under the same: :mod:`.ranges_fault`, a standalone tracker
hung under a sink: :mod:`.hung_fault`, a file sink's query stopped mid-write:
:mod:`.stop_fault`),
a few minutes more; ``--only`` picks among both groups.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lowtide.bench.chaos import faults, hostile, join_fault
from lowtide.bench.chaos.run import Result, Scenario, run_scenario
from lowtide.bench.chaos.workload import Workload
from lowtide.bench.stats import percentile

SCENARIOS = (
    Scenario("quiet"),
    Scenario("kill -9 tracker", (faults.kill_tracker, faults.kill_tracker)),
    Scenario("kill -9 consumer", (faults.kill_consumer,)),
    Scenario("kill -9 shard", (faults.kill_shard,), shards=2),
    Scenario("log byte flipped", (faults.flip_mid_log_byte,)),
    Scenario("torn log tail", (faults.torn_tail,)),
    Scenario("full disk", (faults.full_disk,)),
    Scenario("refused flush", rogue=True),
    Scenario("skewed clocks", skew=((1, 300),)),
    Scenario("hostile peers", attacks=("fuzz", "flood", "hijack", "replay")),
    Scenario("fake server", probe=hostile.fooled_by_fake_server),
    Scenario("hello rewritten", probe=hostile.fooled_by_rewritten_hello),
    Scenario("first handshake cut", lockout_probe=hostile.locked_out_by_a_cut_handshake),
    Scenario("fd exhaustion", attacks=("connections",), nofile=512),
    Scenario("slow handshakes", (faults.kill_tracker,), attacks=("slow handshakes",),
             serve_args=("--max-connections", "64")),
    Scenario("subscription flood", attacks=("subscriptions",)),
    Scenario("producer crash", (faults.crash_producer,), producer="crash"),
    Scenario("tracker outage under a producer", (faults.outage_under_producer,),
             producer="pause"),
    Scenario("front killed mid-join", (join_fault.kill_front_mid_join,), producer="pause"),
    Scenario("dead front", dead_front=True,
             serve_args=("--front-timeout-s", "3", "--dead-fronts", "retire")),
    Scenario("graph changed", (faults.change_graph, faults.kill_tracker)),
    Scenario("slow batch", slow_every=4, serve_args=("--stuck-after-ms", "500")),
    Scenario("leader killed", (faults.kill_leader, faults.kill_leader), standby=True),
    Scenario("leader partitioned", (faults.partition_leader,), standby=True),
)
#: with --spark (lowtide.bench.chaos.spark_faults: real Spark queries and files)
SPARK_SCENARIOS = ("rerun from a new checkpoint", "two writers of one table",
                   "a producer's clock 12 minutes slow",
                   "rows lost in a step, replayed",
                   "retry loop under task failures and a restart",
                   "speculative window under task failures and a restart",
                   "speculative window on the driver under a sink failure and a restart",
                   "key-range window on the driver under a sink failure and a restart",
                   "window on the driver under a sink failure and a restart",
                   "tracker hung under a sink", "tracker hung under a task",
                   "listeners added late to a finished input", "stopped while a sink writes")


def run(work: Workload, names: list[str] | None = None,
        bootstrap: str | None = None) -> list[Result]:
    """The scenarios ``names`` (None: all); the standby ones use the Kafka broker at
    ``bootstrap``, or start one."""
    quiet_agents()
    results = []
    with tempfile.TemporaryDirectory(prefix="lowtide-chaos-") as tmp:
        secret_file = Path(tmp) / "secret"
        secret_file.write_bytes(work.secret or b"")
        os.chmod(secret_file, 0o600)
        chosen = [s for s in SCENARIOS if not names or s.name in names]
        needed = bootstrap is None and any(s.standby for s in chosen)
        with kafka_broker(Path(tmp), needed) as started:
            broker = bootstrap or started
            for k, sc in enumerate(chosen):
                if sc.standby and not isinstance(broker, str):
                    results.append(Result(sc.name, notes=[f"not run: {broker}"]))
                    continue
                scenario_dir = Path(tmp) / f"s{k}"
                scenario_dir.mkdir()
                result = run_scenario(scenario_dir, work, sc, secret_file,
                                      broker if isinstance(broker, str) else None)
                print(f"  {sc.name}: {len(result.premature)} premature, {result.lost} lost,"
                      f" {result.seconds:.1f} s", flush=True)
                results.append(result)
    return results


@contextlib.contextmanager
def kafka_broker(tmp: Path, needed: bool) -> Iterator[str | Exception | None]:
    """A broker for the standby scenarios' step log (``make setup``'s jars), stopped
    after them; the reason instead when it cannot start."""
    if not needed:
        yield None
        return
    from lowtide.apps.kafka_broker import KafkaBrokerConfig

    try:
        broker = KafkaBrokerConfig(tmp / "kafka", start_timeout_s=120).build()
    except Exception as exc:  # no java, no jars: the scenarios say so instead of running
        yield exc
        return
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def summary(results: list[Result]) -> dict[str, Any]:
    def p99(name: str) -> float | None:
        delays = next((r.delays_ms for r in results if r.name == name), [])
        return round(percentile(delays, 99), 2) if delays else None

    def p50(name: str) -> float | None:
        delays = next((r.delays_ms for r in results if r.name == name), [])
        return round(percentile(delays, 50), 2) if delays else None

    failovers = [s for r in results for s in r.failover_s]
    return {
        "bench": "chaos",
        "faults": sum(r.faults for r in results),
        "premature": sum(len(r.premature) for r in results),
        "lost": sum(r.lost for r in results),
        "refused_starts": sum(r.refused_starts for r in results),
        "false_loss_reports": sum(r.false_losses for r in results),
        "left_behind": sum(r.left_behind for r in results),
        "dead_front_retired": any(r.retired for r in results if r.name == "dead front"),
        "failover_s": round(max(failovers), 2) if failovers else None,  # the slowest
        "notify_p50_ms_quiet": p50("quiet"),
        "notify_p99_ms_quiet": p99("quiet"),
        "notify_p50_ms_attacked": p50("hostile peers"),
        "notify_p99_ms_attacked": p99("hostile peers"),
        "scenarios": {r.name: {"faults": r.faults, "premature": len(r.premature),
                               "lost": r.lost, "refused_starts": r.refused_starts,
                               "notify_p99_ms": p99(r.name)}
                      for r in results},
    }


def print_table(results: list[Result]) -> None:
    print(f"{'scenario':<32} {'faults':>6} {'refused':>7} {'premature':>9} {'lost':>4}"
          f" {'notify p50/p99 ms':>18}")
    for r in results:
        lat = (f"{percentile(r.delays_ms, 50):.1f}/{percentile(r.delays_ms, 99):.1f}"
               if r.delays_ms else "-")
        print(f"{r.name:<32} {r.faults:>6} {r.refused_starts:>7} {len(r.premature):>9}"
              f" {r.lost:>4} {lat:>18}")
        for line in [*r.premature[:3], *r.notes[:3]]:
            print(f"    {line}")


def quiet_agents() -> None:
    """The agents' warnings here (a refused lane, unflushed acks, a restarted query's
    heartbeat refused as behind) are the faults this bench makes on purpose: its table
    reports what they did."""
    logging.getLogger("lowtide").setLevel(logging.ERROR)


def main(args: argparse.Namespace) -> int:
    work = Workload(slots=24 if args.quick else 60, secret=b"chaos-secret-0123456789abcdef")
    names = [n.strip() for n in args.only.split(",")] if args.only else None
    known = [s.name for s in SCENARIOS] + (list(SPARK_SCENARIOS) if args.spark else [])
    unknown = set(names or ()) - set(known)
    if unknown:
        raise SystemExit(f"unknown scenarios {sorted(unknown)}; choose from {known}"
                         + ("" if args.spark else " (Spark's: with --spark)"))
    service = [n for n in names or () if n not in SPARK_SCENARIOS]
    results = run(work, service) if service or not names else []
    if args.spark:
        spark_names = [n for n in names or () if n in SPARK_SCENARIOS]
        if spark_names or not names:
            from lowtide.bench.chaos.spark_faults import run_spark  # imports pyspark

            quiet_agents()
            results += run_spark(spark_names or None)
    print_table(results)
    figures = summary(results)
    print(json.dumps(figures))
    return 0 if figures["premature"] == figures["lost"] == figures["left_behind"] == 0 else 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="fewer slots per scenario")
    p.add_argument("--only", help="comma-separated scenario names")
    p.add_argument("--spark", action="store_true",
                   help="also the Spark fault kinds: reruns from a new checkpoint, two "
                        "writers of one table, rows lost in a step and replayed, a retry "
                        "loop under a task failure and a restart, a speculative window "
                        "under task failures and a restart, and on the driver under a "
                        "sink failure, a tracker hung, a file sink's query stopped "
                        "mid-write (needs `make setup`'s Delta jars)")
    p.set_defaults(handler=main)


def register(subparsers: Any, bench_subparsers: Any) -> None:
    add_arguments(bench_subparsers.add_parser(
        "chaos", help="faults and hostile peers: premature and lost notifications"))
