"""Spark's stream-stream join example, ported: every ad impression with the clicks that
came within 15 minutes after it, and the impressions nobody clicked (left outer).

The Spark original (watermarks on both sides, the time range in the condition)::

    joined = impressions.withWatermark("impressionTime", "2 hours").join(
        clicks.withWatermark("clickTime", "3 hours"),
        F.expr("clickAdId = impressionAdId AND clickTime >= impressionTime AND "
               "clickTime <= impressionTime + interval 15 minutes"), "leftOuter")

Here the producers label each record with its event time (``Front(time_from="ts")``)
and write Parquet files while the query runs, the clicks' producer 1.5 s behind the
impressions'; closing the fronts ends the input, so every impression gets its row,
clicked or not. Run it with ``python
examples/impressions_clicks.py``; the suite runs it (tests/test_examples.py) and it
checks its own output against a pandas join of the same records.
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

import lowtide
from lowtide.spark.sources import FilesProducerConfig

MINUTE_MS = 60_000


def produce(pipe: Any, folder: Path, front: int, segment: str, rows: pd.DataFrame,
            lag_s: float) -> int:
    """One producer: labels each record with its ``ts`` and writes a file every 0.2 s
    after ``lag_s``; returns the front's last promise (the end of its input)."""
    f = lowtide.Front(None, front, pipe.tracker_ref, segment=segment, time_from="ts",
                      start_ms=int(rows["ts"].min()))  # where its promises start
    out = FilesProducerConfig(folder).build(f)
    time.sleep(lag_s)
    for part in np.array_split(np.arange(len(rows)), 6):  # six files, in time order
        out.send(rows.iloc[part].reset_index(drop=True))
        time.sleep(0.2)
    return f.close()


def main(spark: Any, work: Path) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    start = (time.time_ns() // 1_000_000 - 3 * 60 * MINUTE_MS) // MINUTE_MS * MINUTE_MS
    imp = pd.DataFrame({"ad_id": rng.integers(0, 40, 200),
                        "ts": start + np.sort(rng.integers(0, 60 * MINUTE_MS, 200))})
    seen = imp.sample(120, random_state=1)  # a click 0-20 minutes after its impression
    clk = pd.DataFrame({"ad_id": seen["ad_id"].to_numpy(),
                        "ts": seen["ts"].to_numpy() + rng.integers(0, 20 * MINUTE_MS, 120)}
                       ).sort_values("ts", ignore_index=True)

    for side in ("impressions", "clicks"):
        (work / side).mkdir(parents=True, exist_ok=True)

    # examples/impressions_clicks.py
    def files(side: str) -> Any:  # rows with the labels the producers wrote
        schema = "ad_id long, ts long, lt_time long, lt_ack long"
        return spark.readStream.schema(schema).parquet(str(work / side))

    with lowtide.Pipeline(spark, "ads") as pipe:
        impressions = (pipe.read_stream(files("impressions"), name="impressions")
                       .selectExpr("ad_id", "timestamp_millis(ts) AS impressionTime")
                       .withColumnRenamed("ad_id", "impressionAdId")
                       .withWatermark("impressionTime", "2 hours"))   # accepted, not needed
        clicks = (pipe.read_stream(files("clicks"), name="clicks")
                  .selectExpr("ad_id AS clickAdId", "timestamp_millis(ts) AS clickTime"))
        joined = impressions.join(clicks, left_on="impressionAdId", right_on="clickAdId",
                                  lower="0 minutes", upper="15 minutes", how="leftOuter")
        pipe.start_tracker(joined.graph())
        query = (joined.writeStream.format("parquet")
                 .option("checkpointLocation", str(work / "checkpoint"))
                 .option("keepTrackingColumns", True)
                 .trigger(processingTime="500 milliseconds").start(str(work / "out")))
        with ThreadPoolExecutor(2) as producers:   # the clicks' producer lags 1.5 s
            promised = min(producers.map(
                lambda side: produce(pipe, work / side[0], side[1], side[0], side[2], side[3]),
                [("impressions", 0, imp, 0.0), ("clicks", 1, clk, 1.5)]))
        query.wait_for_min_time(promised, timeout_s=180)   # the end: every row final
        query.stop()
        got = pd.read_parquet(work / "out")
    # the end of the example

    assert rows_of(got) == batch_join(imp, clk, promised, pipe.grid.delta_ms)
    return got


def rows_of(got: pd.DataFrame) -> set[tuple[int, int, int]]:
    """(ad, impression ms, click ms or -1) of each result row."""
    def ms(ts: Any) -> int:
        return -1 if pd.isna(ts) else int(ts.timestamp() * 1000)

    return {(int(a), ms(i), ms(c)) for a, i, c in
            zip(got["impressionAdId"], got["impressionTime"], got["clickTime"], strict=True)}


def batch_join(imp: pd.DataFrame, clk: pd.DataFrame, promised: int, delta_ms: int
               ) -> set[tuple[int, int, int]]:
    """The same join in pandas, the rows the fronts' promise completes: a pair at its
    later time, an impression nobody clicked 15 minutes after it."""
    m = imp.reset_index().merge(clk, on="ad_id", suffixes=("_i", "_c"))
    pairs = m[(m["ts_c"] >= m["ts_i"]) & (m["ts_c"] <= m["ts_i"] + 15 * MINUTE_MS)]
    out = {(int(a), int(i), int(c)) for a, i, c in zip(pairs["ad_id"], pairs["ts_i"],
                                                        pairs["ts_c"], strict=True)
           if max(i, c) // delta_ms < promised}
    alone = imp[~imp.index.isin(pairs["index"])]
    return out | {(int(a), int(i), -1) for a, i in zip(alone["ad_id"], alone["ts"], strict=True)
                  if (i + 15 * MINUTE_MS) // delta_ms < promised}


if __name__ == "__main__":
    from lowtide.spark import SessionConfig

    with tempfile.TemporaryDirectory() as tmp:
        result = main(SessionConfig().build(), Path(sys.argv[1] if len(sys.argv) > 1 else tmp))
        print(result.sort_values("impressionTime").to_string(max_rows=20))
