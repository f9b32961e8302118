"""End to end, the DataFrame verbs PySpark users reach for: ``selectExpr``,
``withColumnRenamed``, ``drop``, ``withWatermark`` (accepted, changes nothing) and an
exact ``dropDuplicates`` within a time range, under a lagging front and injected task
failures: the kept rows equal a batch pass over the whole input in global time order
(so a late row of the lagging front was never kept where an earlier duplicate
existed), each once, with the columns in the stream's order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import lowtide
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once
from tests.spark.operators.helpers import GRID, SCHEMA, STUCK_MS, all_input, parse, run_timed

pytestmark = pytest.mark.spark

WITHIN = 30  # slots


def batch_first_rows(rows: pd.DataFrame) -> set[tuple[str, int, int]]:
    """(user, front, seq) of each row kept: per user in (slot, ack) order, a row more
    than WITHIN slots after the last kept one. Rows of a user share no slot here
    (checked), so the ack order of a slot's rows does not matter."""
    assert not rows.duplicated(["user", "slot"]).any()
    kept = set()
    for user, g in rows.sort_values("slot").groupby("user"):
        last = None
        for front, seq, slot in zip(g["front"], g["seq"], g["slot"], strict=True):
            if last is None or slot - last > WITHIN:
                kept.add((str(user), int(front), int(seq)))
                last = slot
    return kept


def test_verbs_and_exact_drop_duplicates_equal_batch(spark, tmp_path: Path) -> None:
    # one front, every user on its own slots; the second front lags 800 ms
    spec = GeneratorSpec(fronts=2, rate=40.0, payload_bytes=4, lag_ms={1: 800})
    pipe = lowtide.Pipeline(spark, "verbs", grid=GRID, stuck_after_ms=STUCK_MS)
    before = fail_once(lambda bid, p: bid % 5 == 3 and p == 0)
    stream = (pipe.generate(spec)
              .map(parse, SCHEMA, name="parse")
              .transform(lambda df: df.mapInArrow(before, df.schema))
              .selectExpr("front", "seq", "user AS who", "amount * 2 AS doubled")
              .withColumnRenamed("who", "user")
              .drop("doubled")
              .withWatermark("ts", "10 seconds")
              .dropDuplicates(["user"], within=f"{WITHIN * GRID.delta_ms} milliseconds",
                              name="dedup"))
    assert stream.segment_names() == ["parse", "dedup", "dedup.state", "sink"]
    results, t0, final = run_timed(pipe, stream, tmp_path, 300)
    assert list(results.columns) == ["front", "seq", "user", "lt_time", "lt_ack"]
    got = [(u, int(f), int(s)) for u, f, s in zip(results["user"], results["front"],
                                                   results["seq"], strict=True)]
    assert len(got) == len(set(got)), "a row kept twice"
    rows = all_input(spec, t0, final + 2 * WITHIN)
    expected = batch_first_rows(rows)
    slot_of = {(str(u), int(f), int(s)): int(t) for u, f, s, t in
               zip(rows["user"], rows["front"], rows["seq"], rows["slot"], strict=True)}
    assert set(got) <= expected, "a row kept that the batch pass drops"
    done = {r for r in expected if slot_of[r] < final}
    assert done <= set(got), f"{len(done - set(got))} kept rows below the min time missing"
    assert len(done) >= 20
    assert np.mean([r[1] == 1 for r in done]) > 0.2  # the lagging front's rows are kept too
