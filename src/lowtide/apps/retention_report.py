"""Which input records are complete, so retention can be set from a fact:
``lowtide retention kafka`` and ``lowtide retention log``.

Kafka: a tracker's min time ``t`` (the global one by default: complete end to end)
means every record labelled below ``t`` was processed. Clock fronts stamp each record
with its label time (``lt_time * delta_ms``), so the first offset of each partition
with a timestamp >= ``t``'s start (Kafka's ``offsets_for_times``) bounds what is
complete: every offset below it is. The status comes from ``lowtide status --json``
(a file, or ``-`` for stdin), so this command needs no connection to the tracker.
Keep a margin of a few trigger intervals: Spark re-reads the last batch of a query
that stops before committing its offsets.

The ingest log: per front, the offsets stored, each consumer's commit and the offset
below which all committed (what the log's own retention deletes).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["complete_below_ms", "kafka_offsets", "register"]


def complete_below_ms(status: dict[str, Any], segments: list[str] | None = None) -> int:
    """The start (ms) of the smallest min time over ``segments`` (None: the global)."""
    delta_ms = int(status["delta_ms"])
    if not segments:
        return int(status["global_min"]) * delta_ms
    times = {s["segment"]: int(s["min_time"]) for s in status["segments"]}
    missing = [s for s in segments if s not in times]
    if missing:
        raise ValueError(f"no segment {missing} in the status (segments: {sorted(times)})")
    return min(times[s] for s in segments) * delta_ms


def kafka_offsets(bootstrap: str, topic: str, below_ms: int,
                  timeout_s: float = 10.0) -> dict[int, int]:
    """Per partition: the first offset whose timestamp is >= ``below_ms`` (its end
    offset if none): every offset below it is complete."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lowtide-retention",
                         "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        if meta.error is not None:
            raise ValueError(f"topic {topic!r}: {meta.error}")
        asked = [TopicPartition(topic, p, below_ms) for p in sorted(meta.partitions)]
        out = {}
        for tp in consumer.offsets_for_times(asked, timeout=timeout_s):
            if tp.offset < 0:  # no record at or after below_ms: the whole partition
                tp.offset = consumer.get_watermark_offsets(tp, timeout=timeout_s)[1]
            out[tp.partition] = tp.offset
        return out
    finally:
        consumer.close()


def _kafka(args: argparse.Namespace) -> int:
    status = json.load(sys.stdin if args.status == "-" else open(args.status))  # noqa: SIM115
    below_ms = complete_below_ms(status, args.segment)
    offsets = kafka_offsets(args.bootstrap, args.topic, below_ms)
    print(json.dumps({"topic": args.topic, "complete_below_ms": below_ms,
                      "complete_below_offsets": {str(p): o for p, o in offsets.items()}}))
    return 0


def _log(args: argparse.Namespace) -> int:
    from lowtide.spark.sources import log_status

    print(json.dumps({str(f): s for f, s in log_status(args.dir).items()}))
    return 0


def register(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``lowtide retention kafka|log``."""
    parser = sub.add_parser("retention", help="which input records are complete (to set "
                            "Kafka retention, or see what the ingest log keeps)")
    kinds = parser.add_subparsers(dest="retention", metavar="INPUT")
    kafka = kinds.add_parser("kafka", help="complete offsets of a topic written by fronts")
    kafka.add_argument("--status", default="-",
                       help="`lowtide status --json` output: a file, or - for stdin")
    kafka.add_argument("--topic", required=True)
    kafka.add_argument("--bootstrap", default="127.0.0.1:9092")
    kafka.add_argument("--segment", action="append",
                       help="min over these segments (default: the global min time)")
    kafka.set_defaults(handler=_kafka)
    log = kinds.add_parser("log", help="offsets stored and committed in an ingest log")
    log.add_argument("--dir", required=True, help="the ingest log directory")
    log.set_defaults(handler=_log)
    parser.set_defaults(handler=lambda _args: parser.print_help() or 2)
