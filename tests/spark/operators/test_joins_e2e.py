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
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import lowtide
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once
from tests.spark.operators.helpers import GRID, STUCK_MS, all_input, run_timed

pytestmark = pytest.mark.spark

WITHIN = 15  # slots
WINDOW = 20  # slots, of the window join


def side(prefix: str, key: str = "user"):  # type: ignore[no-untyped-def]
    """The rows of one side: the user (the key, in column ``key``) and the row's
    identity, prefixed."""

    def fn(b: pa.RecordBatch) -> pa.RecordBatch:
        user = pc.cast(pc.bit_wise_and(pc.add(b["seq"], pc.cast(b["front"], pa.int64())), 3),
                       pa.string())
        return pa.record_batch({key: user, f"{prefix}front": b["front"],
                                f"{prefix}seq": b["seq"]})

    return fn


def batch_join(left: pd.DataFrame, right: pd.DataFrame, how: str, window: int,
               bounds: tuple[int, int] = (-WITHIN, WITHIN)) -> pd.DataFrame:
    """The batch recomputation: (l_front, l_seq, r_front, r_seq, time) of every result;
    interval join (``window`` 0, ``lo <= b - a <= hi``): a pair at its later row's
    slot, an unmatched left row at ``a + max(hi, 0)``, a right one at ``b + max(-lo,
    0)``; window join: both at the window's last slot; semi: a matched left row at its
    first pair's slot."""
    lo, hi = bounds
    lf = left.rename(columns={"front": "l_front", "seq": "l_seq", "slot": "a"})
    rf = right.rename(columns={"front": "r_front", "seq": "r_seq", "slot": "b"})
    m = lf[["user", "l_front", "l_seq", "a"]].merge(rf[["user", "r_front", "r_seq", "b"]],
                                                     on="user")

    def last(slots: pd.Series) -> pd.Series:
        return (slots // window + 1) * window - 1

    if window:
        pairs = m[m["a"] // window == m["b"] // window]
        pairs = pairs.assign(time=last(pairs["a"]))
    else:
        pairs = m[(m["b"] - m["a"] >= lo) & (m["b"] - m["a"] <= hi)]
        pairs = pairs.assign(time=np.maximum(pairs["a"], pairs["b"]))
    cols = ["l_front", "l_seq", "r_front", "r_seq", "time"]
    if how == "semi":
        first = pairs.groupby(["l_front", "l_seq"], as_index=False)["time"].min()
        return first.assign(r_front=-1, r_seq=-1)[cols].astype(np.int64)
    out = [] if how == "anti" else [pairs]
    for side, rows, slot, ext in (("l", lf, "a", hi), ("r", rf, "b", -lo)):
        if (side == "l" and how not in ("left", "full", "anti")) or \
                (side == "r" and how not in ("right", "full")):
            continue
        hit = set(zip(pairs[f"{side}_front"], pairs[f"{side}_seq"], strict=True))
        alone = rows[[(f, s) not in hit for f, s in zip(rows[f"{side}_front"],
                                                        rows[f"{side}_seq"], strict=True)]]
        other = "r" if side == "l" else "l"
        at = last(alone[slot]) if window else alone[slot] + max(ext, 0)
        out.append(alone.assign(**{f"{other}_front": -1, f"{other}_seq": -1, "time": at}))
    return pd.concat(out, ignore_index=True)[cols].astype(np.int64)


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


def check_equal(got: pd.DataFrame, final: int, expected_of: Any, least: int = 100) -> None:
    """``got`` (l_front, l_seq, r_front, r_seq, time) equals the batch recomputation
    below the final min time, each result once, and holds nothing else."""
    rows = list(got.itertuples(index=False, name=None))
    assert len(rows) == len(set(rows)), "a result emitted twice"
    horizon = max(final, int(got["time"].max()) + 1)
    expected = expected_of(horizon)
    exp_rows = set(expected[expected["time"] < horizon].itertuples(index=False, name=None))
    assert set(rows) <= exp_rows, "a result the batch join does not have"
    done = {r for r in exp_rows if r[4] < final}
    assert done <= set(rows), f"{len(done - set(rows))} results below the min time missing"
    assert len(done) >= least


def as_rows(got: pd.DataFrame) -> pd.DataFrame:
    for c in ("r_front", "r_seq"):
        if c not in got.columns:  # semi and anti joins: the left columns only
            got = got.assign(**{c: -1})
    return got.fillna(-1)[["l_front", "l_seq", "r_front", "r_seq", "time"]].astype(np.int64)


@pytest.mark.parametrize(("how", "window"), [("inner", 0), ("left", 0), ("full", WINDOW)])
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
    ("right", (-1, 0), "on", ["user", "l_front", "l_seq", "r_front", "r_seq"]),
    ("semi", (0, WITHIN), "condition", ["user", "l_front", "l_seq", "time"]),
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
