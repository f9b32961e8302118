"""``dropDuplicates``' logic without Spark, through the keyed runtime's group step over
random micro-batches and random advances of the inbound min time: the kept rows
equal a batch pass over the rows in global time order (the first of a key kept, the
rows within ``within`` after a kept row dropped), each once, at its own slot, and no
hold is left open."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pandas as pd
import pytest

from lowtide.spark.operators.dedup import DedupLogic
from lowtide.spark.operators.joins import KEY_COL
from lowtide.spark.operators.slot_logic import (
    AT_COL,
    ID_COL,
    SLOT_COL,
    WAKE_COL,
    GroupStep,
    KeptRows,
    step_group,
)

Row = tuple[int, int, str]  # (slot, ack id, key)


def frame(rows: list[Row]) -> pd.DataFrame:
    return pd.DataFrame({
        KEY_COL: pd.Series([k for *_, k in rows], dtype=object),
        "v": np.array([i for _, i, _ in rows], np.int64),
        SLOT_COL: np.array([s for s, _, _ in rows], np.int64),
        ID_COL: np.array([i for _, i, _ in rows], np.int64),
        WAKE_COL: np.array([s for s, _, _ in rows], np.int64),
    })


def brute(rows: list[Row], within: int | None) -> set[tuple[int, int]]:
    """(slot, ack id) of the kept rows."""
    last: dict[str, int] = {}
    kept = set()
    for s, i, k in sorted(rows):
        if k not in last or (within is not None and s - last[k] > within):
            kept.add((s, i))
            last[k] = s
    return kept


class NoParts:
    def read(self, tag: int, count: int) -> list[Any]:
        raise AssertionError("dropDuplicates keeps its rows in its state")


def step_rows(logic: DedupLogic, state: Any, wakes: Any, rows: Any, done: int) -> GroupStep:
    """One call of a bucket: its state and wakes so far, ``rows`` new."""
    return step_group(KeptRows(logic), (0,), state, wakes, rows, done, NoParts())


def run(rows: list[Row], within: int | None, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    todo, kept, done, out, opened = list(rows), None, 0, [], set()
    wakes = np.zeros(0, np.int64)
    logic = DedupLogic(("v",), within)
    while done < 80:
        nxt = min(80, done + rng.randrange(0, 9))
        batch = [r for r in todo if done <= r[0] < nxt + rng.randrange(4)]
        todo = [r for r in todo if r not in batch]
        step = step_rows(logic, kept, wakes, frame(batch) if batch else None, nxt)
        assert not opened & set(step.opens.tolist()), "a hold opened twice"
        opened = (opened | set(step.opens.tolist())) - set(step.releases.tolist())
        if step.out is not None:
            assert list(step.out.columns) == [KEY_COL, "v", AT_COL]
            out += [(int(a), int(v)) for a, v in zip(step.out[AT_COL], step.out["v"],
                                                     strict=True)]
        kept, wakes, done = step.state, step.wakes, nxt
    assert not todo and not opened, "a row or a hold left"
    return out


@pytest.mark.parametrize("within", [None, 0, 4, 15])
@pytest.mark.parametrize("seed", range(3))
def test_drop_duplicates_equals_a_batch_pass(within: int | None, seed: int) -> None:
    rng = random.Random(f"{within}{seed}")
    rows = [(rng.randrange(70), i * 7919 % 10007, rng.choice("abc")) for i in range(60)]
    got = run(rows, within, seed)
    assert len(got) == len(set(got)), "a row kept twice"
    assert set(got) == brute(rows, within)


def test_state_keeps_one_row_per_key_while_it_can_drop() -> None:
    rows = frame([(1, 5, "a"), (2, 6, "a"), (3, 7, "b"), (9, 8, "a")])
    step = step_rows(DedupLogic(("v",), 4), None, np.zeros(0, np.int64), rows, 7)
    assert step.out["v"].tolist() == [5, 7]
    # "a" kept at 1 drops nothing from 7 on, "b" kept at 3 may drop a row at 7; 9 waits
    assert step.state.rows[SLOT_COL].tolist() == [3, 9]
    forever = step_rows(DedupLogic(("v",), None), None, np.zeros(0, np.int64), rows, 7)
    assert forever.state.rows[SLOT_COL].tolist() == [1, 3, 9]


