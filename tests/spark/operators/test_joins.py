"""The join's logic without Spark, driven through the keyed runtime's own group step
(:func:`step_group` over :class:`KeptRows`: kept rows, holds, wakes, expiry) over
random micro-batches and random advances of the inbound min time: its results equal
a brute-force interval (symmetric or with asymmetric bounds) or window join, for
inner, left, right, full, semi and anti joins, with null keys and several keys in one
bucket, each result exactly once at the slot the module docstring promises, every
output under a hold that was open until then, and no hold left at the end."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pandas as pd
import pytest

from lowtide import LowtideError
from lowtide.spark.operators.fold import FoldLogic
from lowtide.spark.operators.joins import KEY_COL, JoinLogic, check_join
from lowtide.spark.operators.slot_logic import (
    AT_COL,
    SLOT_COL,
    WAKE_COL,
    GroupStep,
    KeptRows,
    step_group,
)
from tests.spark.operators.join_rows import Row, brute, frame, sides


class NoParts:
    def read(self, tag: int, count: int) -> list[Any]:
        raise AssertionError("a join keeps its rows in its state")


def step_rows(logic: Any, rows: pd.DataFrame, done: int) -> GroupStep:
    """One call of a group with no state yet and ``rows`` new."""
    return step_group(KeptRows(logic), ("b",), None, np.zeros(0, np.int64), rows, done,
                      NoParts())


def run(logic: Any, left: list[Row], right: list[Row], seed: int
        ) -> list[tuple[int, int, int]]:
    """Rows arrive in random batches (a row before the min time passes its slot), the
    min time jumps ahead at random; (slot, l id, r id) of every output, -1 for none."""
    rng = random.Random(seed)
    arrivals = sorted([(s, 0, r) for s, *_ in left for r in [(s, *_)]]
                      + [(s, 1, r) for s, *_ in right for r in [(s, *_)]])
    kept, wakes, done, out, opened = None, np.zeros(0, np.int64), 0, [], set()
    horizon = 60
    while done < horizon:
        nxt = min(horizon, done + rng.randrange(0, 9))
        batch = [(side, r) for s, side, r in arrivals if done <= s < nxt + rng.randrange(4)]
        arrivals = [a for a in arrivals if (a[1], a[2]) not in batch]
        new = [frame([r for sd, r in batch if sd == side], side) for side in (0, 1)]
        new_rows = pd.concat([f for f in new if len(f)], ignore_index=True) if batch else None
        step = step_group(KeptRows(logic), ("bucket",), kept, wakes, new_rows, nxt, NoParts())
        assert not opened & set(step.opens.tolist()), "a hold opened twice"
        opened |= set(step.opens.tolist())
        assert set(step.releases.tolist()) <= opened, "a hold released that was not open"
        opened -= set(step.releases.tolist())
        assert all(t < nxt for t in step.releases.tolist() if t not in opened)
        if step.out is not None:
            assert step.out[AT_COL].is_monotonic_increasing
            assert len(step.out) == int(step.counts.sum())
            for _, r in step.out.iterrows():
                lid, rid = (int(v) if pd.notna(v) else -1
                            for v in (r["l_id"], r.get("r_id")))
                out.append((int(r[AT_COL]), lid, rid))
        kept, wakes, done = step.state, step.wakes, nxt
    assert not arrivals
    assert kept is None or not (kept.rows[WAKE_COL] >= 0).any(), "a hold left open"
    assert not opened
    return out


HOWS = ["inner", "left", "right", "full", "semi", "anti"]


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize(("lo", "hi"), [(0, 0), (-3, 3), (0, 5), (-6, -2), (2, 9)])
@pytest.mark.parametrize("seed", range(2))
def test_interval_join_equals_a_brute_force_join(how: str, lo: int, hi: int, seed: int
                                                 ) -> None:
    left, right = sides(f"{how}{lo}{hi}{seed}")
    got = run(JoinLogic(("k",), ("l_id",), ("r_id",), lo, hi, how), left, right, seed)
    assert len(got) == len(set(got)), "a result twice"
    assert set(got) == brute(left, right, lo, hi, 0, how)


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("window", [1, 7])
@pytest.mark.parametrize("seed", range(2))
def test_window_join_equals_a_brute_force_join(how: str, window: int, seed: int) -> None:
    left, right = sides(f"win{how}{window}{seed}")
    got = run(JoinLogic(("k",), ("l_id",), ("r_id",), 0, 0, how, window), left, right, seed)
    assert len(got) == len(set(got)), "a result twice"
    assert set(got) == brute(left, right, 0, 0, window, how)


def test_a_group_step_is_the_same_whatever_the_row_order() -> None:
    """A retried task gets the same rows in another order: same outputs, same order."""
    left, right = sides("order")
    logic = JoinLogic(("k",), ("l_id",), ("r_id",), -3, 3, "full")
    rows = pd.concat([frame(left, 0), frame(right, 1)], ignore_index=True)
    a = step_rows(logic, rows, 50)
    b = step_rows(logic, rows.sample(frac=1, random_state=1), 50)
    pd.testing.assert_frame_equal(a.out, b.out)
    assert a.releases.tolist() == b.releases.tolist() and a.counts.tolist() == b.counts.tolist()


def test_keys_match_as_the_jvm_compares_them() -> None:
    """Two long keys pandas sees as the same float (2**53 and 2**53 + 1 in a column with
    nulls) do not match: the merge is on the JVM's key, not on pandas' values."""
    logic = JoinLogic(("k",), ("l_id",), ("r_id",), 0, 0, "inner")
    rows = pd.concat([frame([(5, 1, "x")], 0), frame([(5, 2, "x")], 1)], ignore_index=True)
    rows["k"] = np.array([2.0**53, 2.0**53])  # what pandas made of them
    rows[KEY_COL] = [f'{{"k0":{2**53 + 1}}}', f'{{"k0":{2**53}}}']
    assert step_rows(logic, rows, 9).out is None
    rows[KEY_COL] = [f'{{"k0":{2**53}}}'] * 2
    assert len(step_rows(logic, rows, 9).out) == 1


def test_fold_steps_each_slot_in_order() -> None:
    seen: list[tuple[int, int]] = []

    def fn(key: Any, rows: pd.DataFrame, state: Any) -> tuple[Any, Any]:
        seen.append((len(rows), int(rows["l_id"].iloc[0])))
        return None, pd.DataFrame({"n": [len(rows)]})

    rows = frame([(5, 1, "u"), (3, 2, "u"), (5, 3, "u"), (9, 4, "u")], 0)
    step = step_rows(FoldLogic(fn, "f"), rows, 9)
    assert step.out[AT_COL].tolist() == [3, 5] and step.out["n"].tolist() == [1, 2]
    assert step.releases.tolist() == [3, 5] and step.counts.tolist() == [1, 1]
    assert step.state.rows[SLOT_COL].tolist() == [9] and step.wakes.tolist() == [9]


def test_join_description_errors() -> None:
    assert check_join("j", "leftOuter", 10, within_ms=100) == ("left", -100, 100)
    assert check_join("j", "left_anti", 10, lower_ms=0, upper_ms=900) == ("anti", 0, 900)
    assert check_join("j", "rightouter", 10, window_ms=50)[0] == "right"
    with pytest.raises(LowtideError, match=r"^join 'j': how='cross' \(every pair.*: use one "
                                           r"of inner, left, right, full, semi, anti$"):
        check_join("j", "cross", 10, within_ms=100)
    with pytest.raises(ValueError, match=r"^join 'j': within=15 ms must be a non-negative "
                                         r"multiple of delta_ms=10$"):
        check_join("j", "inner", 10, within_ms=15)
    with pytest.raises(ValueError, match=r"^join 'j': give exactly one of within="):
        check_join("j", "inner", 10, within_ms=100, window_ms=1000)
    with pytest.raises(ValueError, match=r"^join 'j': give exactly one of within="):
        check_join("j", "inner", 10)
    with pytest.raises(ValueError, match=r"^join 'j': give both lower= and upper="):
        check_join("j", "inner", 10, upper_ms=100)
    with pytest.raises(ValueError, match=r"^join 'j': lower=100 ms, upper=0 ms: give lower "
                                         r"<= upper"):
        check_join("j", "inner", 10, lower_ms=100, upper_ms=0)
    with pytest.raises(ValueError, match=r"^join 'j': window=0 ms must be a positive"):
        check_join("j", "inner", 10, window_ms=0)
