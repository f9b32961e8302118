"""Kafka to a table, exact: per user, the count and total of 1-second windows of JSON
records whose event time is their own ``ts`` field, written to a tracked Parquet table
that publishes how far it is complete (``format="delta"`` writes a Delta table the same
way; docs/spark.md, "From your own data").

One producer writes 20 pairs of records through ``lowtide.Front`` (event time from
``ts``, a little disorder) to partition 0 of the topic; closing its front ends the
input, so every window is written, the newest included. Start a broker (``lowtide
kafka up``, ``lowtide kafka topic clicks``) and run ``python examples/kafka_to_table.py
BOOTSTRAP clicks``; the suite runs it on its own broker (tests/test_examples.py) and it
checks the table against a pandas recomputation over every record written.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

import lowtide
from lowtide.spark import complete_below
from lowtide.spark.sources import KAFKA_HEADER_EXPRS, KafkaProducerConfig


def main(spark: Any, work: Path, bootstrapServers: str, topic: str) -> pd.DataFrame:
    BOOTSTRAP, TOPIC, OUT = bootstrapServers, topic, str(work / "clicks")
    # examples/kafka_to_table.py
    pipe = lowtide.Pipeline(spark, "clicks")

    # consumer side: Spark's Kafka source, the labels from the record headers
    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", BOOTSTRAP)
           .option("subscribe", TOPIC).option("startingOffsets", "earliest")
           .option("includeHeaders", "true").load())
    events = raw.selectExpr(
        "from_json(CAST(value AS STRING), 'user STRING, amount DOUBLE') AS e",
        *(f"{expr} AS {col}" for col, expr in KAFKA_HEADER_EXPRS.items()),
    ).selectExpr("e.user AS user", "e.amount AS amount", "lt_time", "lt_ack")
    windows = (pipe.read_stream(events)                     # lt_time, lt_ack -> tracked
               .window("1 second", key="user")
               .agg(n="count", total=("amount", "sum")))
    pipe.start_tracker(windows.graph())

    # producer side (any process with lowtide[service]): event time from the "ts" field
    front = lowtide.Front(None, 0, pipe.tracker_ref, time_from="ts", lag_ms=500)
    producer = KafkaProducerConfig(TOPIC, BOOTSTRAP, partition=0).build(front)
    query = windows.write_table(OUT, checkpoint=OUT + "_checkpoint", format="parquet")
    sent = []
    for _ in range(20):
        now_ms = time.time_ns() // 1_000_000
        records = pd.DataFrame({"user": ["ann", "bob"], "amount": [1.0, 2.0],
                                "ts": [now_ms - 300, now_ms]})  # a little disorder
        producer.send(records)
        sent.append(records)
        time.sleep(0.1)
    last = front.close()              # the end of its input: every window completes
    query.wait_for_min_time(last, timeout_s=300)
    table = spark.read.parquet(OUT).orderBy("window_start").toPandas()
    print(complete_below(OUT))        # what the table published, read without the tracker
    query.stop()
    pipe.close()
    # the end of the example

    assert front.status()["late_clamped"] == 0
    expected = batch_windows(pd.concat(sent))
    got = {(u, int(pd.Timestamp(s).value // 1_000_000)): (int(n), float(t)) for u, s, n, t
           in zip(table["user"], table["window_start"], table["n"], table["total"],
                  strict=True)}
    assert len(got) == len(table), "a window written twice"
    assert got == expected
    return table


def batch_windows(records: pd.DataFrame) -> dict[tuple[str, int], tuple[int, float]]:
    """(user, window start ms) -> (count, total) over every record written."""
    start = records["ts"] // 1000 * 1000
    grouped = records.groupby([records["user"], start])["amount"].agg(["count", "sum"])
    return {(str(u), int(s)): (int(n), float(t)) for (u, s), (n, t) in grouped.iterrows()}


if __name__ == "__main__":
    from lowtide.spark import SessionConfig

    with tempfile.TemporaryDirectory() as tmp:
        session = SessionConfig(kafka=True).build()
        print(main(session, Path(tmp), sys.argv[1], sys.argv[2]).to_string(max_rows=30))
        session.stop()
