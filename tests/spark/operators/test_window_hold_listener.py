"""The window hold's listener against Spark's real listener bus: it moves the hold to
each batch's watermark, ignores the other queries of the session, and never converts
a progress event whole (PySpark's wrapper makes a Py4J call per figure of every event
of every query: 0.7 us per input row of ``lowtide bench spark --shape window``)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from lowtide.spark.operators.window_hold import HoldListener, iso_ms

pytestmark = pytest.mark.spark


class Moves:
    """A hold that records where it was asked to move."""

    window = "w"

    def __init__(self) -> None:
        self.watermarks: list[int] = []

    def advance(self, watermark_ms: int, wait_s: float) -> None:
        self.watermarks.append(watermark_ms)


def watermark_query(spark: Any) -> Any:
    from pyspark.sql import functions as F

    df = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    return (df.withWatermark("timestamp", "1 second")
            .groupBy(F.window("timestamp", "1 second")).count()
            .writeStream.format("noop").outputMode("append")
            .trigger(processingTime="200 milliseconds").start())


def test_the_hold_moves_to_each_batch_watermark_without_converting_events(spark) -> None:
    mine, other = watermark_query(spark), watermark_query(spark)
    moves = Moves()
    listener = HoldListener(moves, str(mine.id))  # type: ignore[arg-type]
    converted: list[Any] = []  # PySpark's wrapper hands its listeners converted events
    listener.onQueryProgress = converted.append  # type: ignore[method-assign]
    spark.streams.addListener(listener)
    try:
        deadline = time.monotonic() + 240
        while len(moves.watermarks) < 3:
            assert time.monotonic() < deadline, "no progress events in 240 s"
            assert mine.exception() is None and other.exception() is None
            assert not converted, "the listener converted progress events whole"
            time.sleep(0.1)
    finally:
        spark.streams.removeListener(listener)
        mine.stop()
        other.stop()
    seen = {iso_ms(p["eventTime"]["watermark"]) for p in mine.recentProgress
            if "watermark" in p["eventTime"]}
    assert set(moves.watermarks) <= seen  # its own query's watermarks, none of the other's
    assert moves.watermarks == sorted(moves.watermarks)
