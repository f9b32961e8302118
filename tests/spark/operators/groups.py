"""A group driven without Spark as the processor drives it (its state pickled between
calls, its holds tracked from the steps' opens and releases, its row parts stored),
for the slot logics' tests; a stream as a step description sees it; and a counting
window with its input rows, random inputs and its batch recomputation."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import strategies as st

from lowtide.spark.operators.slot_logic import (
    AT_COL,
    ID_COL,
    SLOT_COL,
    GroupStep,
    SlotLogic,
    step_group,
)
from lowtide.spark.operators.window_aggs import bind_aggs
from lowtide.spark.operators.window_state import WindowLogic
from lowtide.spark.operators.windows import parse_aggs

NONE = np.zeros(0, np.int64)


class Described:
    """A stream as a description's ``agg`` sees it: the step it is given."""

    def _then(self, spec: Any) -> Any:
        return spec


class Parts:
    """Row parts as the store keeps them: written by appends, pickled, dropped."""

    def __init__(self) -> None:
        self.stored: dict[tuple[int, int], bytes] = {}

    def read(self, tag: int, count: int) -> list[Any]:
        return [pickle.loads(self.stored[(tag, i)]) for i in range(count)]

    def write(self, step: GroupStep) -> None:
        for tag, i, frame in step.appends:
            assert (tag, i) not in self.stored, "a part written twice"
            self.stored[(tag, i)] = pickle.dumps(frame)
        for tag, count in step.drops:
            for i in range(count):
                del self.stored[(tag, i)]


class Group:
    """A group driven as the processor drives it: its state pickled between calls, its
    open holds tracked from the steps' opens and releases, its row parts stored."""

    def __init__(self, logic: SlotLogic) -> None:
        self.logic = logic
        self.data = pickle.dumps(None)
        self.wakes = NONE
        self.holds: set[int] = set()
        self.parts = Parts()

    def retry(self, new: pd.DataFrame | None, done: int, now_ms: int = 0) -> GroupStep:
        """The call, without keeping its effects (an attempt that failed)."""
        return step_group(self.logic, ("k",), pickle.loads(self.data), self.wakes, new, done,
                          self.parts, now_ms)

    def retried_call(self, new: pd.DataFrame | None, done: int, now_ms: int = 0
                     ) -> GroupStep:
        """An attempt that failed, then the call: both must give the same state and rows
        (rules 5 and 6)."""
        again = self.retry(new, done, now_ms)
        step = self.call(new, done, now_ms)
        assert pickle.dumps(again.state) == self.data, "a retried call kept another state"
        for a, b in ((again.early, step.early), (again.out, step.out)):
            assert (a is None) == (b is None)
            if b is not None:
                pd.testing.assert_frame_equal(a, b)
        return step

    def call(self, new: pd.DataFrame | None, done: int, now_ms: int = 0) -> GroupStep:
        step = self.retry(new, done, now_ms)
        self.parts.write(step)
        opens, releases = set(step.opens.tolist()), set(step.releases.tolist())
        assert not opens & self.holds, "a hold opened twice"
        assert releases <= self.holds | opens, "a hold released that was not open"
        self.holds = (self.holds | opens) - releases
        assert self.holds == set(step.wakes.tolist()), "holds are not the wakes"
        if step.out is not None:
            assert len(step.out) == int(step.counts.sum())
            assert set(step.out[AT_COL].tolist()) <= releases
        self.data, self.wakes = pickle.dumps(step.state), step.wakes
        return step


def batches(g: Group, items: list[tuple[Any, ...]], steps: list[int], rng: Any,
            to_rows: Callable[[list[tuple[Any, ...]]], pd.DataFrame]
            ) -> Iterator[tuple[int, pd.DataFrame]]:
    """Drive ``g`` over ``items`` (each a tuple, its slot first) in random
    micro-batches: the min time advances by each of ``steps`` (then past everything),
    rows arrive before it passes them, some a while before; each call is tried once
    and dropped (a failed attempt) first, and must return the same rows and state.
    Yields (the call's ``done``, its output rows) of each call with output."""
    pending, done = list(items), 0
    for advance in [*steps, 100]:
        nxt = done + advance
        batch = [r for r in pending if r[0] < nxt + rng.randrange(6)]
        pending = [r for r in pending if r not in batch]
        new = to_rows(batch) if batch else None
        again = g.retry(new, nxt)
        step = g.call(new, nxt)
        assert pickle.dumps(again.state) == g.data, "a retried call kept another state"
        if step.out is not None:
            pd.testing.assert_frame_equal(again.out, step.out)
            yield nxt, step.out
        done = nxt


# ------------------------------------------------------------------ windows

# count(*), and sum/min/first/last of a nullable long "v" (lt_agg0, lt_valid0: what
# the JVM hands over, see window_aggs)
AGGS, _ = bind_aggs("w", parse_aggs({"n": "count", "s": ("v", "sum"), "lo": ("v", "min"),
                                     "f": ("v", "first"), "l": ("v", "last")}),
                    {"v": "bigint"})


def rows(slots: list[int], ids: list[int] | None = None,
         values: list[int | None] | None = None) -> pd.DataFrame:
    """New rows as the runtime hands them to a logic."""
    ids = ids if ids is not None else list(range(1, len(slots) + 1))
    values = values if values is not None else list(slots)
    return pd.DataFrame({
        "v": pd.Series(values, dtype=object),
        "lt_agg0": np.array([0 if v is None else v for v in values], np.int64),
        "lt_valid0": np.array([v is not None for v in values]),
        SLOT_COL: np.array(slots, np.int64), ID_COL: np.array(ids, np.int64)})


def counting(size: int, slide: int | None = None) -> WindowLogic:
    return WindowLogic(size, slide or size, 10, AGGS)



def batch_windows(items: list[tuple[int, int, int | None]], size: int, slide: int
                  ) -> dict[int, list[Any]]:
    """start -> [n, s, lo, f, l] over every (slot, id, value) of the whole input."""
    out: dict[int, list[Any]] = {}
    starts = {s - s % slide - j * slide for s, _, _ in items for j in range(size // slide)}
    for start in sorted(starts):
        mine = sorted((s, i, v) for s, i, v in items if start <= s < start + size)
        vals = [v for _, _, v in mine if v is not None]
        out[start] = [len(mine), sum(vals) if vals else None, min(vals) if vals else None,
                      vals[0] if vals else None, vals[-1] if vals else None]
    return out


@st.composite
def inputs(draw: Any) -> tuple[list[tuple[int, int, int | None]], int, int, list[int]]:
    slide = draw(st.sampled_from([1, 3, 5]))
    size = slide * draw(st.integers(1, 3))
    n = draw(st.integers(0, 40))
    slots = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    values = draw(st.lists(st.one_of(st.none(), st.integers(-2**62, 2**62)),
                           min_size=n, max_size=n))
    ids = draw(st.permutations(range(1, n + 1)))
    items = list(zip(slots, ids, values, strict=True))
    steps = draw(st.lists(st.integers(0, 12), min_size=1, max_size=30))
    return items, size, slide, steps


def folding(window: pd.DataFrame) -> dict[str, Any]:
    """``apply``'s fn computing what AGGS do, from the rows in the order it gets them."""
    vals = [v for v in window["v"] if v is not None]
    return {"n": len(window), "s": sum(vals) if vals else None, "lo": min(vals, default=None),
            "f": vals[0] if vals else None, "l": vals[-1] if vals else None}
