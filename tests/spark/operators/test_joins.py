"""The join's step logic without Spark: stepped slot by slot as the keyed runtime steps
it (kept rows, wakes, expiry), its results equal a brute-force interval join, for
inner, left and full joins, with a null key, and every result at the slot the module
docstring promises."""

from __future__ import annotations

import heapq
import random
from typing import Any

import pandas as pd
import pytest

from lowtide.spark.operators.joins import SIDE_COL, JoinLogic, check_join


class Steps:
    """The keyed runtime's stepping for one key, in memory (History included)."""

    def __init__(self, logic: JoinLogic, rows: dict[int, pd.DataFrame]) -> None:
        self.logic, self.rows = logic, rows
        self.processed: dict[int, pd.DataFrame] = {}

    def kept(self, lo: int, hi: int) -> list[tuple[int, Any]]:
        return [(s, self.processed[s]) for s in sorted(self.processed) if lo <= s <= hi]

    def get_state(self) -> Any:
        return None

    def set_state(self, value: Any) -> None:
        return None

    def run(self, key: tuple[Any, ...]) -> list[tuple[int, pd.DataFrame]]:
        pending = sorted(self.rows)
        heapq.heapify(pending)
        out = []
        while pending:
            slot = heapq.heappop(pending)
            rows = self.rows.get(slot)
            res, wakes = self.logic.step(key, slot, rows, self)
            for w in wakes:
                if w not in self.rows and w not in pending:
                    heapq.heappush(pending, w)
            if rows is not None:
                self.processed[slot] = rows
            if res is not None:
                out.append((slot, res))
        return out


def brute(left: list[tuple[int, int]], right: list[tuple[int, int]], w: int, how: str,
          null_key: bool) -> set[tuple[Any, ...]]:
    """(slot, l id, r id) of every result; -1 for the missing side."""
    pairs = set() if null_key else {(max(a, b), i, j) for a, i in left for b, j in right
                                    if abs(a - b) <= w}
    out = set(pairs)
    if how != "inner":
        out |= {(a + w, i, -1) for a, i in left if all(p[1] != i for p in pairs)}
    if how == "full":
        out |= {(b + w, -1, j) for b, j in right if all(p[2] != j for p in pairs)}
    return out


@pytest.mark.parametrize("how", ["inner", "left", "full"])
@pytest.mark.parametrize("w", [0, 3])
@pytest.mark.parametrize("null_key", [False, True])
def test_steps_equal_a_brute_force_join(how: str, w: int, null_key: bool) -> None:
    rng = random.Random(f"{how}{w}{null_key}")
    left = [(rng.randrange(40), i) for i in range(30)]
    right = [(rng.randrange(40), 100 + j) for j in range(12)]
    rows: dict[int, pd.DataFrame] = {}
    for side, items in ((0, left), (1, right)):
        for slot, i in items:
            row = pd.DataFrame({"l_id": [i if side == 0 else None],
                                "r_id": [i if side == 1 else None], SIDE_COL: [side]})
            rows[slot] = pd.concat([rows.get(slot), row], ignore_index=True)
    logic = JoinLogic(("l_id",), ("r_id",), w, how)
    key = (None,) if null_key else ("u",)
    got = [(slot, int(lid) if pd.notna(lid) else -1, int(rid) if pd.notna(rid) else -1)
           for slot, res in Steps(logic, rows).run(key)
           for lid, rid in zip(res["l_id"], res["r_id"], strict=True)]
    assert len(got) == len(set(got)), "a result twice"
    assert set(got) == brute(left, right, w, how, null_key)


def test_join_description_errors() -> None:
    with pytest.raises(ValueError, match=r"^join 'j': how='right': .*b.join\(a, how='left'\)"):
        check_join("j", 100, "right", 10)
    with pytest.raises(ValueError, match=r"^join 'j': within=15 ms must be a non-negative "
                                         r"multiple of delta_ms=10$"):
        check_join("j", 15, "inner", 10)
