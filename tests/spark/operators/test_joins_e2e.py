"""End to end, exact joins of two generated streams: interval joins (inner and left
outer, symmetric; left outer, right, semi and anti with asymmetric bounds, keys named
differently on each side or a Column condition) and a full outer window join, under a
lagging front and injected task failures (before the join on one side, after it),
equal a batch recomputation of the same events: every pair and every unmatched row
below the sink's announced min time is there, once, and nothing else (0 rows dropped
as late)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import lowtide
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once
from tests.spark.operators.helpers import GRID, STUCK_MS, all_input, run_timed
from tests.spark.operators.join_rows import WINDOW, WITHIN, as_rows, batch_join, check_equal, side

pytestmark = pytest.mark.spark

def run_join(spark, tmp_path: Path, how: str, keys: str, **match):  # type: ignore[no-untyped-def]
    """Join a lagging 2-front left side with failures before and after the join to a
    sparse right side (``keys``: "on" the same name, "left_on" names that differ, or a
    Column "condition"); (results with -1 for a missing side, the sink's min time,
    both generator specs, their t0)."""
    from pyspark.sql import functions as F

    t0 = int(time.time() * 1000) + 1000
    a = GeneratorSpec(fronts=2, rate=120.0, payload_bytes=4, lag_ms={1: 800}, t0_ms=t0)
    # a right row of a user every 400 ms, 2 * WITHIN is 300 ms: left rows without a match
    b = GeneratorSpec(fronts=1, first_front=2, rate=10.0, payload_bytes=4, t0_ms=t0)
    pipe = lowtide.Pipeline(spark, f"join-{how}-{keys}", grid=GRID, stuck_after_ms=STUCK_MS)
    before = fail_once(lambda bid, p: bid % 5 == 3 and p == 0)
    after = fail_once(lambda bid, p: bid % 4 == 2)
    left = (pipe.generate(a).map(side("l_"), "user string, l_front int, l_seq long",
                                 name="left")
            .transform(lambda df: df.mapInArrow(before, df.schema)))
    rkey = "user" if keys == "on" else "r_user"
    right = pipe.generate(b).map(side("r_", rkey), f"{rkey} string, r_front int, r_seq long",
                                 name="right")
    on = {"on": {"on": "user"}, "left_on": {"left_on": "user", "right_on": "r_user"},
          "condition": {"on": F.col("r_user") == F.col("user")}}[keys]
    joined = (left.join(right, how=how, name="j", **on, **match)
              .transform(lambda df: df.mapInArrow(after, df.schema)))
    assert joined.segment_names() == ["left", "right", "j", "j.state", "sink"]
    results, _, final = run_timed(pipe, joined, tmp_path, 250)
    got = results.rename(columns={"lt_time": "time"})
    return got, final, a, b, t0


# left: ~40 s, outer rows by default in the full join (and the asymmetric left below)
@pytest.mark.parametrize(("how", "window"), [
    ("inner", 0), pytest.param("left", 0, marks=pytest.mark.slow), ("full", WINDOW)])
def test_join_with_lag_and_failures_equals_batch(spark, tmp_path: Path, how: str,
                                                 window: int) -> None:
    match = ({"window": window * GRID.delta_ms} if window
             else {"within": WITHIN * GRID.delta_ms})
    got, final, a, b, t0 = run_join(spark, tmp_path, how, "on", **match)
    assert list(got.columns[:5]) == ["user", "l_front", "l_seq", "r_front", "r_seq"]
    rows = as_rows(got)
    check_equal(rows, final, lambda h: batch_join(all_input(a, t0, h), all_input(b, t0, h),
                                                  how, window))
    done = rows[rows["time"] < final]
    assert (done["r_front"] != -1).any()
    if how != "inner":
        assert (done["r_front"] == -1).any()  # unmatched left rows, emitted when complete


@pytest.mark.parametrize(("how", "bounds", "keys", "columns"), [
    # Spark's "click BETWEEN impression AND impression + 15 slots", left outer: every
    # impression without a click in that range gets its outer row
    ("left", (0, WITHIN), "left_on", ["user", "l_front", "l_seq", "r_user", "r_front"]),
    pytest.param("right", (-1, 0), "on", ["user", "l_front", "l_seq", "r_front", "r_seq"],
                 marks=pytest.mark.slow),  # ~20 s; the left one by default
    pytest.param("semi", (0, WITHIN), "condition", ["user", "l_front", "l_seq", "time"],
                 marks=pytest.mark.slow),  # ~20 s; the anti one by default
    ("anti", (-4, WITHIN), "on", ["user", "l_front", "l_seq", "time"]),
])
def test_asymmetric_join_equals_batch(spark, tmp_path: Path, how: str,
                                      bounds: tuple[int, int], keys: str,
                                      columns: list[str]) -> None:
    lower, upper = (f"{v * GRID.delta_ms} milliseconds" for v in bounds)  # "-10 ..."
    match = {"lower": lower, "upper": upper}
    got, final, a, b, t0 = run_join(spark, tmp_path, how, keys, **match)
    assert list(got.columns[:len(columns)]) == columns
    rows = as_rows(got)
    # a right row matches left rows of one slot or the one before: few results
    check_equal(rows, final, lambda h: batch_join(all_input(a, t0, h), all_input(b, t0, h),
                                                  how, 0, bounds), 20 if how == "right" else 100)
    done = rows[rows["time"] < final]
    if how in ("left", "right"):
        assert (done["r_front"] == -1).any() if how == "left" else (done["l_front"] == -1).any()
