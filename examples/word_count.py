"""Spark's Kafka word count, ported: the running count of each word in the lines of a
Kafka topic, without a window.

The Spark original (``structured_kafka_wordcount.py``)::

    lines = spark\\
        .readStream\\
        .format("kafka")\\
        .option("kafka.bootstrap.servers", bootstrapServers)\\
        .option(subscribeType, topics)\\
        .load()\\
        .selectExpr("CAST(value AS STRING)")
    words = lines.select(explode(split(lines.value, ' ')).alias('word'))
    wordCounts = words.groupBy('word').count()
    query = wordCounts.writeStream.outputMode('complete').format('console').start()

Here two producers write lines through ``lowtide.Front`` to the topic's two partitions
(the labels ride in the records' headers); the second one's clock is 1.5 s behind (its
lines reach Spark 1.5 s after their label). The query writes, per word and slot in
which the word came, its count over every line below the slot's end: the running
count, final. Start a broker (``lowtide kafka up``, ``lowtide kafka topic words
--partitions 2``) and run ``python examples/word_count.py BOOTSTRAP words``; the suite
runs it on its own broker (tests/test_examples.py) and it checks its output against the
counts of every line the producers wrote.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.functions import col, split

import lowtide
from lowtide.spark.sources import KAFKA_HEADER_EXPRS, KafkaProducerConfig

WORDS = ["apache", "spark", "kafka", "stream", "lowtide", "exact"]
#: the labels a front put in each record's headers, as columns
LABELS = [f"{expr} AS {column}" for column, expr in KAFKA_HEADER_EXPRS.items()]


class Behind:
    """A clock ``lag_ms`` behind the wall clock."""

    def __init__(self, lag_ms: int) -> None:
        self.lag_ms = lag_ms

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 - self.lag_ms


def produce(front: Any, bootstrap: str, topic: str) -> tuple[int, list[tuple[int, str]]]:
    """One producer, its front's partition: 30 lines of 1-4 words, a line every 0.1 s;
    returns its last heartbeat and (slot, line) of each line it wrote."""
    rng = np.random.default_rng(front.front)
    # examples/word_count.py (a producer)
    out = KafkaProducerConfig(topic, bootstrap, partition=front.front).build(front)
    written = []
    for _ in range(30):
        line = " ".join(rng.choice(WORDS, rng.integers(1, 5)))
        batch = out.send([line.encode()])   # label, produce, wait for delivery, written()
        written.append((int(batch.times[0]), line))
        time.sleep(0.1)
    return front.close(), written


def main(spark: Any, work: Path, bootstrapServers: str, topics: str) -> pd.DataFrame:
    subscribeType = "subscribe"

    # examples/word_count.py
    with lowtide.Pipeline(spark, "wordcount") as pipe:
        # Create DataSet representing the stream of input lines from kafka
        lines = spark\
            .readStream\
            .format("kafka")\
            .option("kafka.bootstrap.servers", bootstrapServers)\
            .option(subscribeType, topics)\
            .option("startingOffsets", "earliest")\
            .option("includeHeaders", "true")\
            .load()\
            .selectExpr("CAST(value AS STRING)", *LABELS)   # the fronts' labels
        lines = pipe.read_stream(lines, fronts=[0, 1])       # its two producers

        # Split the lines into words
        words = lines.explode(split(col("value"), " "), "word")

        # Generate running word count
        wordCounts = words.groupBy("word").count()

        # Start running the query that writes the running counts, each once, final
        pipe.start_tracker(wordCounts.graph())
        query = (wordCounts.writeStream.outputMode("append").format("parquet")
                 .option("checkpointLocation", str(work / "checkpoint"))
                 .start(str(work / "out")))
        # the second producer's clock lags 1.5 s: its front registers first (registered
        # after the other, below where the segment started, it would be refused as behind)
        fronts = [lowtide.Front(None, p, pipe.tracker_ref, clock=Behind(1500 * p)) for p in (1, 0)]
        with ThreadPoolExecutor(2) as producers:
            runs = list(producers.map(lambda f: produce(f, bootstrapServers, topics), fronts))
        promised = min(last for last, _ in runs)
        query.wait_for_min_time(promised, timeout_s=180)
        query.stop()
        got = pd.read_parquet(work / "out")
    # the end of the example

    written = [w for _, lines_written in runs for w in lines_written]
    assert len(got) >= 20 and counts_of(got, pipe.grid.delta_ms) == batch_counts(written, promised)
    return got


def counts_of(got: pd.DataFrame, delta_ms: int) -> dict[tuple[str, int], int]:
    """(word, slot) -> count of each output row: the slot whose end is ``as_of``."""
    assert list(got.columns) == ["word", "count", "as_of"]
    ms = pd.to_datetime(got["as_of"], utc=True).map(lambda t: t.value // 1_000_000)
    keys = list(zip(got["word"], ms // delta_ms - 1, strict=True))
    assert len(keys) == len(set(keys)), "a count written twice"
    return {(str(w), int(s)): int(n) for (w, s), n in zip(keys, got["count"], strict=True)}


def batch_counts(written: list[tuple[int, str]], promised: int
                 ) -> dict[tuple[str, int], int]:
    """Per word and slot with the word below the producers' last promise: the count of
    the word in every line at or below that slot."""
    out, running = {}, Counter[str]()
    for slot, line in sorted(written):
        running.update(line.split(" "))
        for word in set(line.split(" ")):
            out[(word, slot)] = running[word]  # a later line of the same slot overwrites
    return {k: n for k, n in out.items() if k[1] < promised}


if __name__ == "__main__":
    from lowtide.spark import SessionConfig

    with tempfile.TemporaryDirectory() as tmp:
        result = main(SessionConfig(kafka=True).build(), Path(tmp), sys.argv[1], sys.argv[2])
        print(result.sort_values(["as_of", "word"]).to_string(max_rows=30))
