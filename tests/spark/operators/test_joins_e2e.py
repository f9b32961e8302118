"""End to end, exact joins of two generated streams: interval joins (inner and left
outer) and a full outer window join, under a lagging front and injected task failures
(before the join on one side, after it), equal a batch recomputation of the same
events: every pair and every unmatched row below the sink's announced min time is
there, once, and nothing else (0 rows dropped as late)."""

from __future__ import annotations

import time
from pathlib import Path

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


def side(prefix: str):  # type: ignore[no-untyped-def]
    """The rows of one side: the user (the key) and the row's identity, prefixed."""

    def fn(b: pa.RecordBatch) -> pa.RecordBatch:
        user = pc.cast(pc.bit_wise_and(pc.add(b["seq"], pc.cast(b["front"], pa.int64())), 3),
                       pa.string())
        return pa.record_batch({"user": user, f"{prefix}front": b["front"],
                                f"{prefix}seq": b["seq"]})

    return fn


def batch_join(left: pd.DataFrame, right: pd.DataFrame, how: str, window: int
               ) -> pd.DataFrame:
    """The batch recomputation: (l_front, l_seq, r_front, r_seq, time) of every result;
    interval join (``window`` 0): a pair at its later row's slot, an unmatched row at
    its slot + WITHIN; window join: both at the window's last slot."""
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
        pairs = m[(m["a"] - m["b"]).abs() <= WITHIN]
        pairs = pairs.assign(time=np.maximum(pairs["a"], pairs["b"]))
    out = [pairs]
    for side, rows, slot in (("l", lf, "a"), ("r", rf, "b")):
        if how == "inner" or (how == "left" and side == "r"):
            continue
        hit = set(zip(pairs[f"{side}_front"], pairs[f"{side}_seq"], strict=True))
        alone = rows[[(f, s) not in hit for f, s in zip(rows[f"{side}_front"],
                                                        rows[f"{side}_seq"], strict=True)]]
        other = "r" if side == "l" else "l"
        at = last(alone[slot]) if window else alone[slot] + WITHIN
        out.append(alone.assign(**{f"{other}_front": -1, f"{other}_seq": -1, "time": at}))
    cols = ["l_front", "l_seq", "r_front", "r_seq", "time"]
    return pd.concat(out, ignore_index=True)[cols].astype(np.int64)


@pytest.mark.parametrize(("how", "window"), [("inner", 0), ("left", 0), ("full", WINDOW)])
def test_join_with_lag_and_failures_equals_batch(spark, tmp_path: Path, how: str,
                                                 window: int) -> None:
    t0 = int(time.time() * 1000) + 1000
    a = GeneratorSpec(fronts=2, rate=120.0, payload_bytes=4, lag_ms={1: 800}, t0_ms=t0)
    # a right row of a user every 400 ms, 2 * WITHIN is 300 ms: left rows without a match
    b = GeneratorSpec(fronts=1, first_front=2, rate=10.0, payload_bytes=4, t0_ms=t0)
    pipe = lowtide.Pipeline(spark, f"join-{how}-{window}", grid=GRID, stuck_after_ms=STUCK_MS)
    before = fail_once(lambda bid, p: bid % 5 == 3 and p == 0)
    after = fail_once(lambda bid, p: bid % 4 == 2)
    left = (pipe.generate(a).map(side("l_"), "user string, l_front int, l_seq long",
                                 name="left")
            .transform(lambda df: df.mapInArrow(before, df.schema)))
    right = pipe.generate(b).map(side("r_"), "user string, r_front int, r_seq long",
                                 name="right")
    match = ({"window": window * GRID.delta_ms} if window
             else {"within": WITHIN * GRID.delta_ms})
    joined = (left.join(right, on="user", how=how, name="j", **match)
              .transform(lambda df: df.mapInArrow(after, df.schema)))
    assert joined.segment_names() == ["left", "right", "j", "j.state", "sink"]
    results, _, final = run_timed(pipe, joined, tmp_path, 250)
    got = results.rename(columns={"lt_time": "time"})
    assert list(got.columns[:5]) == ["user", "l_front", "l_seq", "r_front", "r_seq"]
    got = got.fillna(-1)[["l_front", "l_seq", "r_front", "r_seq", "time"]].astype(np.int64)
    rows = list(got.itertuples(index=False, name=None))
    assert len(rows) == len(set(rows)), "a result emitted twice"
    horizon = max(final, int(got["time"].max()) + 1)
    expected = batch_join(all_input(a, t0, horizon), all_input(b, t0, horizon), how,
                          window)
    expected = expected[expected["time"] < horizon]
    exp_rows = set(expected.itertuples(index=False, name=None))
    assert set(rows) <= exp_rows, "a result the batch join does not have"
    done = {r for r in exp_rows if r[4] < final}
    assert done <= set(rows), f"{len(done - set(rows))} results below the min time missing"
    assert len(done) >= 150
    assert any(r[2] != -1 for r in done)
    if how != "inner":
        assert any(r[2] == -1 for r in done)  # unmatched left rows, emitted when complete
