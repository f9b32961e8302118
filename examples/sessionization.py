"""Spark's sessionization example, ported: the words of each line are session ids; a
session of a word ends when the word is not seen for 10 seconds; each session with its
bounds, its length and its number of events.

The Spark original (``structured_sessionization.py``, lines from a socket with their
arrival time)::

    events = lines.select(explode(split(lines.value, ' ')).alias('sessionId'),
                          lines.timestamp.alias('eventTime'))
    windowedCounts = events \\
        .groupBy(session_window(events.eventTime, "10 seconds").alias('session'),
                 events.sessionId) \\
        .agg(count("*").alias("numEvents")) \\
        .selectExpr("sessionId", "CAST(session.start AS LONG)", "CAST(session.end AS LONG)",
                    "CAST(session.end AS LONG) - CAST(session.start AS LONG) AS durationMs",
                    "numEvents")
    query = windowedCounts.writeStream.outputMode('update').format('console').start()

Here two producers write lines with their event time (an ISO 8601 string, read by
``Front(time_from="ts")`` as it is) to JSON files, about three minutes of event time in
a few seconds; the second one lags 1.5 s behind. The query is live; each session is
written once, when no line that could extend it can still come. Run it with ``python
examples/sessionization.py``; the suite runs it (tests/test_examples.py) and it checks
its output against a pandas sessionization of every line the producers wrote.
"""

from __future__ import annotations

import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.functions import col, split

import lowtide
from lowtide.spark.sources import FilesProducerConfig

GAP_MS = 10_000
WORDS = ["ann", "bob", "cid", "dee", "eve"]


def lines_of(seed: int, start_ms: int) -> pd.DataFrame:
    """About three minutes of lines: 1-3 words each, 0.2 to 15 s apart."""
    rng = np.random.default_rng(seed)
    ts = start_ms + np.cumsum(rng.integers(2, 150, 40) * 100)
    text = [" ".join(rng.choice(WORDS, rng.integers(1, 4))) for _ in ts]
    iso = pd.to_datetime(ts, unit="ms", utc=True).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return pd.DataFrame({"value": text, "ts": list(iso), "ms": ts})


def produce(pipe: Any, folder: Path, front: int, rows: pd.DataFrame, lag_s: float,
            start_ms: int) -> int:
    """One producer: a file of four lines every 0.2 s, after ``lag_s``; returns its
    last promise (every line it wrote is below it)."""
    f = lowtide.Front(None, front, pipe.tracker_ref, time_from="ts", start_ms=start_ms)
    out = FilesProducerConfig(folder, format="json").build(f)
    time.sleep(lag_s)
    for part in np.array_split(np.arange(len(rows)), 10):
        out.send(rows.iloc[part][["value", "ts"]].reset_index(drop=True))
        time.sleep(0.2)
    return f.close()


def main(spark: Any, work: Path) -> pd.DataFrame:
    start_ms = (time.time_ns() // 1_000_000 - 3_600_000) // 1000 * 1000
    inputs = [lines_of(seed, start_ms) for seed in (1, 2)]
    (work / "lines").mkdir(parents=True, exist_ok=True)
    schema = "value string, ts string, lt_time long, lt_ack long"

    # examples/sessionization.py
    with lowtide.Pipeline(spark, "sessionization") as pipe:
        lines = pipe.read_stream(spark.readStream.schema(schema).json(str(work / "lines")))

        # Split the lines into words, retaining timestamps
        # treat words as sessionId of events
        events = lines.explode(split(col("value"), " "), "sessionId")

        # Group the data by session window and word and compute the count of each group
        windowedCounts = (
            events.session_window("10 seconds", key="sessionId")
            .agg(numEvents="count")
            .selectExpr("sessionId", "CAST(session_window_start AS LONG) AS start",
                        "CAST(session_window_end AS LONG) AS end",
                        "CAST(session_window_end AS LONG) - CAST(session_window_start AS LONG)"
                        " AS durationMs", "numEvents"))

        # Start running the query that writes each session once, when it is final
        pipe.start_tracker(windowedCounts.graph())
        query = (windowedCounts.writeStream.outputMode("append").format("parquet")
                 .option("checkpointLocation", str(work / "checkpoint"))
                 .start(str(work / "out")))
        with ThreadPoolExecutor(2) as producers:   # the second one lags 1.5 s
            promised = min(producers.map(
                lambda i: produce(pipe, work / "lines", i, inputs[i], 1.5 * i, start_ms),
                (0, 1)))
        query.wait_for_min_time(promised, timeout_s=180)
        query.stop()
        got = pd.read_parquet(work / "out")
    # the end of the example

    expected = batch_sessions(pd.concat(inputs), promised * pipe.grid.delta_ms)
    assert len(expected) >= 10 and sessions_of(got) == expected
    return got


def sessions_of(got: pd.DataFrame) -> set[tuple[str, int, int, int]]:
    """(word, start s, end s, events) of each output row, each once."""
    assert list(got.columns) == ["sessionId", "start", "end", "durationMs", "numEvents"]
    rows = list(zip(got["sessionId"], got["start"], got["end"], got["numEvents"], strict=True))
    assert len(rows) == len(set(rows)), "a session written twice"
    assert all(e - s == d for (_, s, e, _), d in zip(rows, got["durationMs"], strict=True))
    return {(str(w), int(s), int(e), int(n)) for w, s, e, n in rows}


def batch_sessions(lines: pd.DataFrame, complete_ms: int) -> set[tuple[str, int, int, int]]:
    """The same sessions in pandas, those the producers' promise made final: per word,
    its lines' times; a line at most GAP_MS after the last one extends the session."""
    words = lines.assign(word=lines["value"].str.split(" ")).explode("word")
    out = set()
    for word, ms in words.groupby("word")["ms"]:
        times = np.sort(ms.to_numpy())
        cut = np.flatnonzero(np.diff(times) > GAP_MS) + 1
        for run in np.split(times, cut):
            end = int(run[-1]) + GAP_MS
            if end < complete_ms:
                out.add((str(word), int(run[0]) // 1000, end // 1000, len(run)))
    return out


if __name__ == "__main__":
    from lowtide.spark import SessionConfig

    with tempfile.TemporaryDirectory() as tmp:
        result = main(SessionConfig().build(), Path(sys.argv[1] if len(sys.argv) > 1 else tmp))
        print(result.sort_values("start").to_string(max_rows=20))
