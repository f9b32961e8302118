"""Two tracked queries appending to one Delta table, and a query reading it (docs/spark.md,
"Two writers of one table"): each writer declares both, so the table's published
completeness is the slower writer's, and the reader waits for both.

Two generated streams of 150 rows each, the second one second behind, write the
table; a third query copies the table to Parquet files. Run it with ``python
examples/two_writers.py``; the suite runs it (tests/test_examples.py) and it checks
that the copy holds every generated row once, and what the table published.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

import lowtide
from lowtide.spark import complete_below

SCHEMA = "front int, seq long"
ROWS = 150  # per front


def parse(b: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch({"front": b["front"], "seq": b["seq"]})


def main(spark: Any, work: Path) -> pd.DataFrame:
    events, copy = str(work / "events"), str(work / "copy")
    spark.createDataFrame([], f"{SCHEMA}, lt_time long, lt_ack long").write.format(
        "delta").save(events)                      # the table exists before they start
    with lowtide.Pipeline(spark, "two-writers") as pipe:
        a = (pipe.generate(fronts=1, rate=100.0, rows_per_front=ROWS)
             .map(parse, SCHEMA, name="parse_a"))
        b = (pipe.generate(fronts=1, first_front=1, rate=100.0, rows_per_front=ROWS,
                           lag_ms={1: 1_000})
             .map(parse, SCHEMA, name="parse_b"))
        silver = pipe.read_stream(spark.readStream.format("delta").load(events), name="silver")
        pipe.start_tracker(pipe.plan((a, "a"), (b, "b"), (silver, "gold")).graph)
        # examples/two_writers.py
        a.write_table(events, checkpoint=str(work / "c_a"), name="a", writers=("a", "b"),
                      feeds=("silver",))
        b.write_table(events, checkpoint=str(work / "c_b"), name="b", writers=("a", "b"),
                      feeds=("silver",))
        # the end of the example
        gold = silver.write_parquet(copy, checkpoint=str(work / "c_gold"), name="gold")
        deadline = time.monotonic() + 600
        while len(got := rows(copy)) < 2 * ROWS:   # every row generated, through both
            assert time.monotonic() < deadline and gold.exception() is None, got
            time.sleep(0.5)
        published = complete_below(events)
    assert sorted(got) == [(f, s) for f in (0, 1) for s in range(ROWS)], "not each row once"
    assert published is not None and dict(published.writers).keys() == {"a", "b"}
    assert published.complete_below == min(c for _w, c in published.writers)
    return pd.DataFrame(got, columns=["front", "seq"])


def rows(folder: str) -> list[tuple[int, int]]:
    """(front, seq) of every row in the Parquet files written so far (a file still being
    written is read on the next call)."""
    out: list[tuple[int, int]] = []
    for f in sorted(Path(folder).glob("part-*.parquet")):
        try:
            df = pd.read_parquet(f, columns=["front", "seq"])
        except (OSError, ValueError):
            return []
        out += zip(df["front"].tolist(), df["seq"].tolist(), strict=True)
    return out


if __name__ == "__main__":
    from lowtide.spark import SessionConfig

    with tempfile.TemporaryDirectory() as tmp:
        print(main(SessionConfig(delta=True).build(), Path(tmp)).to_string(max_rows=20))
