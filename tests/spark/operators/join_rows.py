"""Rows of a join's two sides for tests without Spark: a side's input frame as the
JVM hands it to the join's group, random sides, and a brute-force join of them."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pandas as pd

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


