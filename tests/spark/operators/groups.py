"""A group driven without Spark as the processor drives it (its state pickled between
calls, its holds tracked from the steps' opens and releases, its row parts stored),
for the slot logics' tests; and a stream as a step description sees it."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd

from lowtide.spark.operators.slot_logic import AT_COL, GroupStep, SlotLogic, step_group

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
