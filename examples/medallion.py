"""Two queries chained through Delta tables on one tracker (docs/spark.md, "Chained
queries"): Kafka -> bronze (the positive amounts) -> gold (a count per user and
second). The bronze table is the front of the query that reads it, so the gold
table's published completeness means "complete through both queries"; it is read
without Spark or the tracker (``complete_below``), and as of a time
(``lowtide.read_complete``, docs/operating.md, "Consistent cuts").

One producer writes JSON records through ``lowtide.Front`` to partition 0 of the
topic. Start a broker (``lowtide kafka up``, ``lowtide kafka topic payments``) and run
``python examples/medallion.py BOOTSTRAP payments``; the suite runs it on its own
broker (tests/test_examples.py) and it checks the gold table, and what it holds as of
a time, against a pandas recomputation over every record written.
"""

from __future__ import annotations

import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

import lowtide
from lowtide.spark import complete_below
from lowtide.spark.sources import KAFKA_HEADER_EXPRS, KafkaProducerConfig


def read_kafka(spark: Any, bootstrap: str, topic: str) -> Any:
    """The topic's JSON records (``user``, ``amount``) and their labels (headers)."""
    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", topic).option("startingOffsets", "earliest")
           .option("includeHeaders", "true").load())
    return raw.selectExpr(
        "from_json(CAST(value AS STRING), 'user STRING, amount DOUBLE') AS e",
        *(f"{expr} AS {col}" for col, expr in KAFKA_HEADER_EXPRS.items()),
    ).selectExpr("e.user AS user", "e.amount AS amount", "lt_time", "lt_ack")


def produce(producer: Any, sent: list[pd.DataFrame], rounds: int) -> None:
    """``rounds`` pairs of records 0.1 s apart (every third amount is 0: not clean)."""
    for i in range(rounds):
        records = pd.DataFrame({"user": ["ann", "bob"], "amount": [float(i % 3), 2.0]})
        sent.append(records.assign(lt_time=producer.send(records).times))
        time.sleep(0.1)


def published_past(table: str, slot: int, more: Any) -> None:
    """Produce ``more`` until ``table`` published completeness past ``slot`` (a record
    is the value known when a batch starts: an idle stream publishes nothing new)."""
    deadline = time.monotonic() + 300
    while (c := complete_below(table)) is None or c.complete_below <= slot:
        assert time.monotonic() < deadline, f"{table} published {c}"
        more()


def main(spark: Any, work: Path, bootstrapServers: str, topic: str) -> pd.DataFrame:
    T, C = work / "t", work / "c"                # tables, checkpoints
    kafka_df = read_kafka(spark, bootstrapServers, topic)
    bronze_schema = "user string, amount double, lt_time long, lt_ack long"
    # examples/medallion.py (chained)
    with lowtide.Pipeline(spark, "medallion") as pipe:
        bronze = pipe.read_stream(kafka_df, name="ingest").where("amount > 0", name="clean")
        spark.createDataFrame([], bronze_schema).write.format("delta").save(f"{T}/bronze")
        gold = (pipe.read_stream(spark.readStream.format("delta").load(f"{T}/bronze"),
                                 name="silver")
                .window("1 second", key="user").agg(n="count"))
        pipe.start_tracker(pipe.plan((bronze, "bronze"), (gold, "gold")).graph)  # both
        bronze.write_table(f"{T}/bronze", checkpoint=f"{C}/bronze", name="bronze",
                           feeds=("silver",))
        query = gold.write_table(f"{T}/gold", checkpoint=f"{C}/gold", name="gold")
        # the end of the part

        front = lowtide.Front(None, 0, pipe.tracker_ref)
        producer = KafkaProducerConfig(topic, bootstrapServers, partition=0).build(front)
        sent: list[pd.DataFrame] = []
        produce(producer, sent, rounds=20)
        middle = int(pd.concat(sent)["lt_time"].median())
        published_past(f"{T}/gold", middle, lambda: produce(producer, sent, rounds=2))
        as_of = datetime.fromtimestamp(middle * pipe.grid.delta_ms / 1000, UTC)
        # examples/medallion.py (completeness)
        c = complete_below(f"{T}/gold")       # Delta log or manifest; no Spark, no tracker
        print(c.complete_below_ms, c.version)  # every row with lt_time below it is in it
        print(c.writer, c.writers)            # the writer holding it back; each one's own
        print(complete_below(f"{T}/gold", version=c.version))  # as of a Delta version
        # examples/medallion.py (cut)
        df = lowtide.read_complete(spark, f"{T}/gold", as_of=as_of)
        # the end of the example

        cut = df.toPandas()
        query.wait_for_min_time(front.close(), timeout_s=300)  # every window complete
        gold_rows = spark.read.format("delta").load(f"{T}/gold").toPandas()
    records = pd.concat(sent, ignore_index=True)
    expected = windows(records[records["amount"] > 0], pipe.grid.delta_ms)
    assert len(expected) >= 4 and counts(gold_rows) == expected
    below = -(-int(as_of.timestamp() * 1000) // pipe.grid.delta_ms)   # rounded up to a slot
    assert counts(cut) == counts(gold_rows[gold_rows["lt_time"] < below]) != {}
    return gold_rows


def windows(records: pd.DataFrame, delta_ms: int) -> dict[tuple[str, int], int]:
    """(user, window start ms) -> count: the batch recomputation."""
    start = records["lt_time"] * delta_ms // 1000 * 1000
    return {(u, int(s)): int(n) for (u, s), n in records.groupby([records["user"], start])
            .size().items()}


def counts(rows: pd.DataFrame) -> dict[tuple[str, int], int]:
    ms = pd.to_datetime(rows["window_start"], utc=True).map(lambda t: t.value // 1_000_000)
    got = {(u, int(s)): int(n) for u, s, n in zip(rows["user"], ms, rows["n"], strict=True)}
    assert len(got) == len(rows), "a window written twice"
    return got


if __name__ == "__main__":
    from lowtide.spark import SessionConfig

    with tempfile.TemporaryDirectory() as tmp:
        spark = SessionConfig(kafka=True, delta=True).build()
        print(main(spark, Path(tmp), sys.argv[1], sys.argv[2]).to_string(max_rows=20))
