"""A Kafka sliding-window maximum, ported: per sensor, the highest reading in windows
of 15 minutes that slide by 5, from JSON readings in a Kafka topic.

The kind of program ported (a public PySpark example, 24 lines of code): it reads
the topic with Spark's Kafka source, takes the sensor id from the record key and
``{"CreatedTime": "2019-02-05 09:54:00", "Reading": 36.2}`` from the value
(``from_json``), turns ``CreatedTime`` into a timestamp (``to_timestamp`` with
``"yyyy-MM-dd HH:mm:ss"``), sets a 30-minute watermark on it, groups by the sensor id
and ``window(CreatedTime, "15 minute", "5 minute")``, takes ``max("Reading")`` as
``MaxReading``, selects ``SensorID, window.start, window.end, MaxReading`` and writes
them to the console in ``update`` mode every minute.

Here two producers write the readings through ``lowtide.Front`` (labelled with
``CreatedTime``, read as it is: ``time_format="yyyy-MM-dd HH:mm:ss"``) to the topic's
two partitions, an hour of readings in a few seconds; the second one starts 1.5 s
late, and each sends two readings 20 minutes old at its end: late, so its front clamps
them (labels them at its promise) and counts them, and the window counts them too
(``clamped_flag``). Each window is written once, when it is complete; closing the
fronts ends the input, so the windows holding the newest readings are written too.
Start a broker (``lowtide kafka up``, ``lowtide kafka topic sensor --partitions 2``)
and run ``python examples/sliding_max.py BOOTSTRAP sensor``; the suite runs it on its
own broker (tests/test_examples.py) and it checks its output against a pandas
recomputation over every reading written, at the time its front labelled it.
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
from pyspark.sql.functions import col, from_json, get_json_object, to_timestamp

import lowtide
from lowtide.spark.sources import KAFKA_HEADER_EXPRS, KafkaProducerConfig, clamped_flag

MINUTE_MS = 60_000
SIZE_MS, SLIDE_MS = 15 * MINUTE_MS, 5 * MINUTE_MS
FORMAT = "yyyy-MM-dd HH:mm:ss"
#: the labels a front put in each record's headers, as columns
LABELS = [f"{expr} AS {column}" for column, expr in KAFKA_HEADER_EXPRS.items()]


def readings(partition: int, start_ms: int) -> pd.DataFrame:
    """An hour of two sensors' readings, one every 30 s each, in time order."""
    rng = np.random.default_rng(partition)
    ms = np.repeat(start_ms + np.arange(120) * 30_000, 2)
    sensors = np.tile([f"S{2 * partition}", f"S{2 * partition + 1}"], 120)
    return pd.DataFrame({"SensorID": sensors, "ms": ms,
                         "Reading": np.round(rng.normal(36.6, 0.8, len(ms)), 1)})


def as_records(rows: pd.DataFrame) -> pd.DataFrame:
    """What a producer writes: the key and the JSON value's fields."""
    created = pd.to_datetime(rows["ms"], unit="ms").dt.strftime("%Y-%m-%d %H:%M:%S")
    return pd.DataFrame({"SensorID": rows["SensorID"].to_numpy(), "CreatedTime": created,
                         "Reading": rows["Reading"].to_numpy()})


def produce(pipe: Any, bootstrap: str, topic: str, partition: int, start_ms: int,
            lag_s: float) -> tuple[int, pd.DataFrame]:
    """One producer: 4 minutes of readings every 0.1 s, after ``lag_s``, then two
    readings 20 minutes old; returns its last heartbeat and what it wrote, with the
    label of each reading."""
    front = lowtide.Front(None, partition, pipe.tracker_ref, time_from="CreatedTime",
                          time_format=FORMAT, start_ms=start_ms)
    out = KafkaProducerConfig(topic, bootstrap, partition=partition,
                              key_column="SensorID").build(front)
    rows = readings(partition, start_ms)
    late = rows.iloc[-82:-80].assign(Reading=40.0)  # 20 minutes old at the end
    time.sleep(lag_s)
    written = []
    for part in [*(rows.iloc[p] for p in np.array_split(np.arange(len(rows)), 15)), late]:
        batch = out.send(as_records(part))
        written.append(part.assign(slot=batch.times))
        time.sleep(0.1)
    return front.close(), pd.concat(written, ignore_index=True)


def main(spark: Any, work: Path, bootstrapServers: str, topic: str) -> pd.DataFrame:
    start_ms = (time.time_ns() // 1_000_000 - 2 * 3_600_000) // SLIDE_MS * SLIDE_MS
    schema = "CreatedTime string, Reading double"

    # examples/sliding_max.py
    with lowtide.Pipeline(spark, "sensors") as pipe:
        created = to_timestamp(get_json_object(col("value").cast("string"), "$.CreatedTime"),
                               FORMAT)                # for the count of clamped readings
        kafka_source_df = spark.readStream \
            .format("kafka") \
            .option("kafka.bootstrap.servers", bootstrapServers) \
            .option("subscribe", topic) \
            .option("startingOffsets", "earliest") \
            .option("includeHeaders", "true") \
            .load() \
            .selectExpr("*", *LABELS) \
            .withColumn("clamped", clamped_flag(created, pipe.grid.delta_ms))
        kafka_source_df = pipe.read_stream(kafka_source_df)   # tracked from here on

        value_df = kafka_source_df.select(col("key").cast("string").alias("SensorID"),
                                          from_json(col("value").cast("string"), schema)
                                          .alias("value"), "clamped")
        sensor_df = value_df.select("SensorID", "value.*", "clamped") \
            .withColumn("CreatedTime", to_timestamp(col("CreatedTime"), "yyyy-MM-dd HH:mm:ss"))

        agg_df = sensor_df \
            .withWatermark("CreatedTime", "30 minute") \
            .window("15 minute", slide="5 minute", key="SensorID") \
            .agg(MaxReading=("Reading", "max"), clamped=("clamped", "sum"))

        output_df = agg_df.select("SensorID", "window_start", "window_end", "MaxReading",
                                  "clamped")

        pipe.start_tracker(output_df.graph())
        window_query = output_df.writeStream \
            .format("parquet") \
            .outputMode("append") \
            .option("checkpointLocation", str(work / "checkpoint")) \
            .trigger(processingTime="1 second") \
            .start(str(work / "out"))
        with ThreadPoolExecutor(2) as producers:      # the second one starts 1.5 s late
            runs = list(producers.map(lambda p: produce(
                pipe, bootstrapServers, topic, p, start_ms, 1.5 * p), (0, 1)))
        promised = min(last for last, _ in runs)      # every front ended: the input's end
        window_query.wait_for_min_time(promised, timeout_s=180)
        late = pipe.status().late                     # what each front clamped
        window_query.stop()
        got = pd.read_parquet(work / "out")
    # the end of the example

    written = pd.concat([w for _, w in runs], ignore_index=True)
    assert {f: c["late_clamped"] for f, c in late.items()} == {"0": 2, "1": 2}, late
    expected, have = batch_max(written, pipe.grid.delta_ms), windows_of(got)
    differ = sorted(k for k in expected.keys() | have.keys() if expected.get(k) != have.get(k))
    assert len(expected) >= 50 and not differ, [(k, expected.get(k), have.get(k))
                                                 for k in differ[:5]]
    return got


def windows_of(got: pd.DataFrame) -> dict[tuple[str, int], tuple[float, int]]:
    """(sensor, window start ms) -> (max reading, clamped readings), each window once."""
    assert list(got.columns) == ["SensorID", "window_start", "window_end", "MaxReading",
                                 "clamped"]
    starts = pd.to_datetime(got["window_start"], utc=True).map(lambda t: t.value // 1_000_000)
    keys = list(zip(got["SensorID"], starts, strict=True))
    assert len(keys) == len(set(keys)), "a window written twice"
    return {(str(s), int(t)): (float(m), int(n)) for (s, t), m, n
            in zip(keys, got["MaxReading"], got["clamped"], strict=True)}


def batch_max(written: pd.DataFrame, delta_ms: int) -> dict[tuple[str, int], tuple[float, int]]:
    """The same windows in pandas over every reading written, each at its label (a
    clamped one at its front's promise): every window, the last ones included."""
    at_ms = written["slot"] * delta_ms
    out: dict[tuple[str, int], tuple[float, int]] = {}
    for k in range(SIZE_MS // SLIDE_MS):  # each reading is in SIZE / SLIDE windows
        start = at_ms // SLIDE_MS * SLIDE_MS - k * SLIDE_MS
        rows = written.assign(start=start, clamped=(written["ms"] // delta_ms
                                                    < written["slot"]).astype(int))
        for (sensor, s), g in rows.groupby(["SensorID", "start"]):
            m, n = out.get((sensor, s), (float("-inf"), 0))
            out[(str(sensor), int(s))] = (max(m, float(g["Reading"].max())),
                                          n + int(g["clamped"].sum()))
    return out


if __name__ == "__main__":
    from lowtide.spark import SessionConfig

    with tempfile.TemporaryDirectory() as tmp:
        result = main(SessionConfig(kafka=True).build(), Path(tmp), sys.argv[1], sys.argv[2])
        print(result.sort_values(["window_start", "SensorID"]).to_string(max_rows=30))
