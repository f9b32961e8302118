"""Early results of an aggregation without a window (rule 13): ``stream.groupBy(k,
every=...).agg(...).speculative(every=None)``, a changelog of each (key, ``as_of``).

::

    changes = events.groupBy("user", every="1 second").agg(n="count").speculative()

Without ``speculative()`` a key's row for a range (``as_of``, the range's end) is
emitted once the input is complete to ``as_of``: the aggregates over every row of the
key below it. That is the final version of (key, ``as_of``). Before it, each
micro-batch that brings the key rows shows, for each of its pending ranges (ranges
with rows, not complete yet), the running result over the rows so far below its
``as_of`` (the key's emitted total and its pending ranges up to that one): what the
row would be if the range were complete now. A row arriving in an earlier pending
range changes every later one's result too, so each shows a new version. A changed
version is preceded by the tombstone of the last one; the final by the tombstone of
the last early version.

The changelog: the keys, the aggregates, ``as_of``, ``op``, ``version``,
``is_final``, as a window's (:mod:`.speculative`) with ``as_of`` for the window: a
version is (key, ``as_of``, ``version``). ``every`` bounds how often a (key,
``as_of``) shows a new version (the second ``every``, of ``speculative``; the one of
``groupBy`` is the ranges' length).

Rules: every row sits at its range's last slot ``as_of - 1``, a child of the hold the
pending range keeps there (rule 7) with its own index (:data:`.speculative.EARLY_BASE`
+ version and insert or tombstone), so a downstream min time past ``as_of`` covers
every version and tombstone of it; the final is sent with the hold's release.
Versions come from the key's state in the store: a retried task or a batch re-run
after a restart emits the same versions with the same acks (rules 5 and 6).

Worked example (ranges of 10 slots, ``count``, every batch): rows at slots 3 and 12
with ``done = 2``: early ``insert v1 n=1 as_of 10`` at slot 9, ``insert v1 n=2 as_of
20`` at 19. A row at 5 with ``done = 4``: ``tombstone v1 n=1``, ``insert v2 n=2`` of
``as_of 10``; ``tombstone v1 n=2``, ``insert v2 n=3`` of ``as_of 20``. A call with
``done = 10``: out ``tombstone v2``, ``insert v3 n=2 final`` of ``as_of 10``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.spark.operators.keyed_state import StatefulSpec
from lowtide.spark.operators.running import AS_OF, GroupedSpec, Running, RunningLogic
from lowtide.spark.operators.slot_logic import LogicStep, RowParts
from lowtide.spark.operators.speculative import (
    Shown,
    aggs_every,
    changelog_frame,
    changelog_keyed_step,
    changelog_step,
)
from lowtide.spark.operators.window_aggs import merge, results


@dataclass(frozen=True)
class RunningVersions:
    """A key's state: its running aggregation's and the version each pending range
    last showed, by the range's start."""

    running: Running
    shown: dict[int, Shown]


@dataclass(frozen=True)
class SpeculativeRunning:
    """The running aggregation ``running`` with early versions per (key, range),
    re-emitted at most every ``every_ms`` (0: every call that changes one)."""

    running: RunningLogic
    every_ms: int = 0

    def step(self, key: tuple[Any, ...], state: RunningVersions | None, new: Any, done: int,
             parts: RowParts, now_ms: int = 0) -> LogicStep:
        aggs, every = self.running.aggs, self.running.every
        total = state.running.total if state else None
        ranges = dict(state.running.ranges) if state else {}
        shown = state.shown if state else {}
        self.running.absorb(ranges, new)
        values: dict[int, list[Any]] = {}
        acc = total
        for start in sorted(ranges):  # each range's result: every row below its end
            acc = ranges[start] if acc is None else merge(aggs, acc, ranges[start])
            values[start] = results(aggs, acc)
            if start + every <= done:  # the complete ranges come first
                total = acc
                del ranges[start]
        changed = (new is not None and len(new)) or self.every_ms  # else no pending one did
        looked = values if changed else {s: v for s, v in values.items() if s not in ranges}
        left, out, early = changelog_step({s: s + every for s in looked}, values.__getitem__,
                                          shown, done, now_ms, self.every_ms)
        left.update({s: v for s, v in shown.items() if s in ranges and s not in looked})
        wakes = np.array(sorted(s + every - 1 for s in ranges), np.int64)
        delta = self.running.delta_ms
        return LogicStep(RunningVersions(Running(total, ranges), left),
                         changelog_frame(aggs, delta, out, AS_OF), wakes,
                         early=changelog_frame(aggs, delta, early, AS_OF))


@dataclass(frozen=True)
class SpeculativeGroupedSpec(GroupedSpec):
    """A ``groupBy().agg()`` step with early versions (its changelog), ``changes_ms``
    the least time between two versions of a (key, ``as_of``) (0: none)."""

    changes_ms: int = 0

    def keyed(self, logic: RunningLogic, schema: str) -> StatefulSpec:
        return changelog_keyed_step(self, SpeculativeRunning(logic, self.changes_ms),
                                    schema, "groupBy", self.changes_ms)


def make_speculative_grouped(step: GroupedSpec, every: str | int | None
                             ) -> SpeculativeGroupedSpec:
    """``stream.groupBy(...).agg(...).speculative(every=...)``."""
    changes_ms = aggs_every(f"groupBy {step.name!r}", step, every,
                            isinstance(step, SpeculativeGroupedSpec))
    return SpeculativeGroupedSpec(step.name, step.keys, step.every_ms, step.aggs,
                                  step.poll_ms, changes_ms)


def writes_grouped_changelog(step: Any) -> bool:
    """Does ``step`` (a stream's last) write a ``groupBy``'s changelog?"""
    return isinstance(step, SpeculativeGroupedSpec)
