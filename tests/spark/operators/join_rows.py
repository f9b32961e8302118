"""Rows of a join's two sides for tests: without Spark, a side's input frame as the
JVM hands it to the join's group, random sides and a brute-force join of them; end to
end, a generated side's columns, the batch recomputation and the check against it."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from lowtide.spark.operators.joins import KEY_COL, SIDE_COL
from lowtide.spark.operators.slot_logic import ID_COL, SLOT_COL, WAKE_COL

Row = tuple[int, int, Any]  # (slot, id, key)


def frame(items: list[Row], side: int) -> pd.DataFrame:
    ids = [i for _, i, _ in items]
    return pd.DataFrame({
        "k": pd.Series([k for _, _, k in items], dtype=object),
        "l_id": pd.Series([i if side == 0 else None for i in ids], dtype="float64"),
        "r_id": pd.Series([i if side == 1 else None for i in ids], dtype="float64"),
        SIDE_COL: np.full(len(items), side, np.int8),
        # what the JVM computes (joins.jvm_key): the keys' JSON, null for a null key
        KEY_COL: pd.Series([None if k is None else f'{{"k0":"{k}"}}' for _, _, k in items],
                           dtype=object),
        SLOT_COL: np.array([s for s, _, _ in items], np.int64),
        ID_COL: np.array(ids, np.int64) * 7919 % 10007,  # ack ids: not in row order
        WAKE_COL: np.array([s for s, _, _ in items], np.int64),
    })


def brute(left: list[Row], right: list[Row], lo: int, hi: int, window: int, how: str
          ) -> set[tuple[int, int, int]]:
    """(slot, l id, r id) of every result; -1 for the missing side. Interval joins:
    ``lo <= b - a <= hi``."""
    def at(a: int, b: int) -> int:
        return (a // window + 1) * window - 1 if window else max(a, b)

    def near(a: int, b: int) -> bool:
        return a // window == b // window if window else lo <= b - a <= hi

    def alone(a: int, ext: int) -> int:
        return (a // window + 1) * window - 1 if window else a + max(ext, 0)

    pairs = {(at(a, b), i, j) for a, i, k in left for b, j, q in right
             if k is not None and k == q and near(a, b)}
    lone_left = {(alone(a, hi), i, -1) for a, i, _ in left if all(p[1] != i for p in pairs)}
    if how == "semi":
        return {(min(p[0] for p in pairs if p[1] == i), i, -1) for i in {p[1] for p in pairs}}
    if how == "anti":
        return lone_left
    out = set(pairs)
    if how in ("left", "full"):
        out |= lone_left
    if how in ("right", "full"):
        out |= {(alone(b, -lo), -1, j) for b, j, _ in right if all(p[2] != j for p in pairs)}
    return out


def sides(seed: str) -> tuple[list[Row], list[Row]]:
    rng = random.Random(seed)
    keys = ["u", "v", "w", None]
    left = [(rng.randrange(40), i, rng.choice(keys)) for i in range(40)]
    right = [(rng.randrange(40), 100 + j, rng.choice(keys)) for j in range(25)]
    return left, right


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
