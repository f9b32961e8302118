"""Slot logics: what an exact stateful step does with a group's rows, kept apart from
Spark and the tracker, so that it is tested with plain pandas frames.

A *group* is a key (or, for a join, a bucket of keys). The one runtime
(:mod:`.keyed_state`, its processor in :mod:`.state_processor`) calls the group's logic
once per micro-batch that brings rows of the group or finds one of its pending outputs
complete::

    logic.step(key, state, new, done, parts, now_ms) -> LogicStep(state, out, wakes)

* ``state``: what the previous call returned (None at first), kept by the runtime in
  the group's record in the state store, so it survives restarts from the checkpoint;
* ``new``: the rows that arrived (the step's columns plus :data:`SLOT_COL` and
  :data:`ID_COL`, in no particular order: (slot, ack id) is the fixed one), or None.
  Every new row's slot is ``>= done``: it was in flight until this batch received it;
* ``done``: the inbound segment's min time at the batch: every row below it has arrived;
* ``now_ms``: the batch's timestamp (the same in every attempt: processing-time timers);
* the result's ``out``: output rows with :data:`AT_COL` (their slot), each below
  ``done``, or None; ``wakes``: the slots of the group's pending outputs, each
  ``>= done``; ``state``: what to keep (None: nothing; pending outputs need state).

A logic that keeps many rows until an output needs them (a window's ``apply``) need not
rewrite them every call: it returns them as ``appends`` (tagged parts, written once)
and reads them back from ``parts`` (:class:`RowParts`) when it emits, then ``drops``
them (every part, before its state forgets the tag).

Holds (rule 7) are the runtime's, derived from the wakes: :func:`step_group` opens a
hold in the state segment at every new wake, releases every wake that is gone, and
sends each output as a child of the hold at its slot (opened and released in the
same batch if no wake sat there). The logic's part of the bargain: an output it
emits at slot ``t`` was covered, since the call that received its first row, by a
wake at or below ``t``. A window's wake is its last slot; a join's pair sits at its
later row's slot, whose own wake covered it.

Worked example, a tumbling window of 10 slots counting rows (:mod:`.window_state`):
rows at slots 3 and 7 arrive with ``done = 2``: no output, wakes ``[9]`` (a hold opens
at 9). A call with ``done = 12``: out one row at slot 9, wakes ``[]`` (the hold at 9
is released after the row's send-ack, in the same batch).

A logic may also return ``early`` rows: provisional outputs (rule 13, a speculative
window's versions and tombstones, :mod:`.speculative`) at the slot of a wake that stays
open, each with its child index under that slot's hold (:data:`CHILD_COL`, distinct
per row and the same in every attempt); the runtime sends them as children of the
hold and leaves it open, so everything downstream still waits for the final output.

:class:`KeptRows` makes a logic over ALL the group's rows (:class:`RowLogic`: a
user's fold with its timers, :mod:`.fold`; the joins) a slot logic: it keeps the rows,
each with its wake, and the timers' wakes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

# the runtime's columns (a Spark column starting with "_" is renamed on its way into
# transformWithStateInPandas, hence the lt_ prefix)
SLOT_COL = "lt_slot"  # a row's slot
ID_COL = "lt_id"  # its ack id: a fixed order within a slot
AT_COL = "lt_at"  # an output row's slot
WAKE_COL = "lt_wake"  # KeptRows: the slot of the hold a kept row keeps open, -1 none
CHILD_COL = "lt_child"  # an early row's child index under its slot's hold (rule 13)
RUNTIME_COLS = (SLOT_COL, ID_COL, WAKE_COL)


@dataclass(frozen=True)
class LogicStep:
    """What a slot logic returns; see the module docstring."""

    state: Any
    out: Any
    wakes: np.ndarray
    appends: tuple[tuple[int, int, Any], ...] = ()  # (tag, index, rows): parts to keep
    drops: tuple[tuple[int, int], ...] = ()  # (tag, count): a tag's parts to forget
    #: provisional rows (rule 13) with AT_COL at a wake that stays open and CHILD_COL
    early: Any = None


class RowParts(Protocol):
    """The row parts a group's logic appended in earlier calls (``appends``): the
    first ``count`` parts of ``tag``, in order."""

    def read(self, tag: int, count: int) -> list[Any]: ...


class SlotLogic(Protocol):
    """A group's step; see the module docstring. Must be deterministic (Spark re-runs
    tasks) and must not change ``state`` in place (a retried call gets it again)."""

    def step(self, key: tuple[Any, ...], state: Any, new: Any, done: int, parts: RowParts,
             now_ms: int) -> LogicStep: ...


@dataclass(frozen=True)
class GroupStep:
    """One call of a group, in the runtime's terms (:func:`step_group`)."""

    state: Any  # what to keep (None: nothing)
    out: Any  # output rows, sorted by AT_COL (None: none)
    wakes: np.ndarray  # the slots of the holds open after the call, ascending
    opens: np.ndarray  # slots whose holds open now
    releases: np.ndarray  # slots whose holds are released now, ascending
    counts: np.ndarray  # output rows at each released slot
    appends: tuple[tuple[int, int, Any], ...] = ()  # the logic's, to store
    drops: tuple[tuple[int, int], ...] = ()
    early: Any = None  # the logic's provisional rows, their holds left open (None: none)


def step_group(logic: SlotLogic, key: tuple[Any, ...], state: Any, wakes: np.ndarray,
               new: Any, done: int, parts: RowParts, now_ms: int = 0) -> GroupStep:
    """Step a group whose holds are open at ``wakes``: the logic's step and the holds
    it implies. Pure: the processor and the tests drive it."""
    before = np.unique(np.asarray(wakes, np.int64))
    res = logic.step(key, state, new, done, parts, now_ms)
    after = np.unique(np.asarray(res.wakes, np.int64))
    out, at = res.out, np.zeros(0, np.int64)
    if out is not None and len(out):
        at = out[AT_COL].to_numpy(np.int64)
        order = np.argsort(at, kind="stable")
        out, at = out.iloc[order].reset_index(drop=True), at[order]
    else:
        out = None
    arrived = np.zeros(0, np.int64) if new is None else new[SLOT_COL].to_numpy(np.int64)
    _check(at, before, after, arrived, done, res.state)
    times, n = np.unique(at, return_counts=True)
    opens = np.setdiff1d(np.union1d(after, times), before)
    releases = np.setdiff1d(np.union1d(before, opens), after)
    counts = np.zeros(len(releases), np.int64)
    counts[np.searchsorted(releases, times)] = n
    early = res.early if res.early is not None and len(res.early) else None
    if early is not None and not np.isin(early[AT_COL].to_numpy(np.int64), after).all():
        raise RuntimeError("a provisional row at a slot whose hold does not stay open")
    return GroupStep(res.state, out, after, opens, releases, counts, res.appends, res.drops,
                     early)


#: a group's ranges: a bucket's key ranges (rule 15), or None alone (a group without
#: ranges): range -> (the slots of its open holds, its state)
Ranges = dict[int | None, tuple[np.ndarray, Any]]


def range_order(r: int | None) -> int:
    """Ranges in ascending order (None, a group without ranges, first)."""
    return -1 if r is None else r


def step_ranges(logic: SlotLogic, key: tuple[Any, ...], ranges: Ranges,
                new: dict[int | None, Any], done: dict[int | None, int], parts: RowParts,
                now_ms: int = 0, eager: bool = False
                ) -> tuple[Ranges, list[tuple[int | None, GroupStep]]]:
    """Step a group whose keys are split into ranges: each range's keys as a group of
    their own, with that range's min time ``done[r]`` and holds of their own, so that
    what one range emits never releases a hold another range keeps. Steps the ranges
    with ``new`` rows or a wake below their ``done`` (``eager``: any wake, rule 13);
    returns the ranges kept and (range, its step) of each. Pure."""
    kept, steps = dict(ranges), []
    for r in sorted(done, key=range_order):
        wakes = kept.get(r, (np.zeros(0, np.int64), None))[0]
        if r not in new and (not len(wakes) or (int(wakes[0]) >= done[r] and not eager)):
            continue
        _, state = kept.pop(r, (wakes, None))
        step = step_group(logic, key, state, wakes, new.get(r), done[r], parts, now_ms)
        if step.state is not None:
            kept[r] = (step.wakes, step.state)
        steps.append((r, step))
    return kept, steps


def key_in_two_ranges(ranges: Ranges) -> tuple[Any, list[int]] | None:
    """A key kept by two key ranges of a bucket (each range's state a dict by key),
    with those ranges, or None: its window could be emitted before the other range's
    rows arrive. A key's new rows stay in its state after the step that received them
    (their windows end after them, above ``done``), so this also finds a key whose rows
    of one batch came from two ranges."""
    seen: dict[Any, int] = {}
    for r, (_, state) in sorted(ranges.items()):
        for k in state or {}:
            if seen.setdefault(k, r) != r:
                return k, [seen[k], r]
    return None


def two_ranges(what: str, key: Any, ranges: list[int], key_ranges: int) -> ValueError:
    """The one-line refusal of a key of step ``what`` whose rows came from two key
    ranges (its window could be emitted before the other range's rows)."""
    return ValueError(f"{what}: key {key} has rows of key ranges {ranges}; with "
                      f"key_ranges={key_ranges} each key's rows must come from fronts of "
                      "one range")


def _check(at: np.ndarray, before: np.ndarray, after: np.ndarray, arrived: np.ndarray,
           done: int, state: Any) -> None:
    """Fail closed on a logic that breaks its contract (see the module docstring)."""
    if len(at) and int(at[-1]) >= done:
        raise RuntimeError(f"an output at slot {int(at[-1])} >= {done}, which the inbound "
                           "segment has not completed")
    if len(after) and int(after[0]) < done:
        raise RuntimeError(f"a wake at slot {int(after[0])} below {done} left unresolved")
    covered = np.concatenate([before, arrived])
    if len(at) and (not len(covered) or int(at[0]) < int(covered.min())):
        raise RuntimeError(f"an output at slot {int(at[0])} that no hold covered")
    if len(after) and state is None:
        raise RuntimeError("pending outputs without state")


# ------------------------------------------------------------------ kept rows


class UserState(Protocol):
    """A group's own value (``stream.stateful``'s ``state``) and, for a fold, its
    timers, for a :class:`RowLogic`."""

    timers: dict[int, int]  # a fold's timers: expiry ms -> the slot it waits at
    now_ms: int  # the batch's timestamp

    def get_state(self) -> Any: ...

    def set_state(self, value: Any) -> None: ...


class RowLogic(Protocol):
    """A group's step over ALL its rows: ``rows`` (sorted by slot, then ack id; None
    when only timers are due) are the kept and the new ones, with
    :data:`RUNTIME_COLS` (a new row's wake is its slot); every wake below ``done``
    (the rows' and the timers') must be resolved. Returns (output rows with
    :data:`AT_COL`, each below ``done``, or None; the rows to keep, each wake -1 or
    at least ``done``)."""

    def run(self, key: tuple[Any, ...], rows: Any, done: int, user: UserState
            ) -> tuple[Any, Any]: ...


@dataclass(frozen=True)
class Kept:
    """The state of a :class:`KeptRows` group: its rows, the user's value and timers."""

    rows: Any  # pandas DataFrame with RUNTIME_COLS, sorted; None: none
    user: Any  # None: none
    timers: dict[int, int] | None = None  # expiry ms -> wake slot (a fold's); None: none


class _UserBox:
    """A :class:`UserState` over one call."""

    def __init__(self, state: Kept | None, now_ms: int) -> None:
        self.value = None if state is None else state.user
        self.timers = dict(state.timers or {}) if state is not None else {}
        self.now_ms = now_ms

    def get_state(self) -> Any:
        return self.value

    def set_state(self, value: Any) -> None:
        self.value = value


def wakes_of(rows: Any) -> np.ndarray:
    """The slots of the holds kept ``rows`` keep open (ascending, unique)."""
    if rows is None or not len(rows):
        return np.zeros(0, np.int64)
    w = rows[WAKE_COL].to_numpy(np.int64)
    return np.unique(w[w >= 0])


@dataclass(frozen=True)
class KeptRows:
    """A :class:`RowLogic` as a slot logic: the group keeps its rows (state
    :class:`Kept`), a new row waking at its own slot, and its timers; the logic runs
    when a wake is below ``done``."""

    logic: RowLogic

    def step(self, key: tuple[Any, ...], state: Kept | None, new: Any, done: int,
             parts: RowParts, now_ms: int) -> LogicStep:
        import pandas as pd

        user = _UserBox(state, now_ms)
        frames = [] if state is None or state.rows is None else [state.rows]
        if new is not None and len(new):
            frames.append(new.assign(**{WAKE_COL: new[SLOT_COL].to_numpy(np.int64)}))
        rows = None
        if frames:
            rows = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
            order = np.lexsort((rows[ID_COL].to_numpy(), rows[SLOT_COL].to_numpy()))
            rows = rows.iloc[order].reset_index(drop=True)
        out = None
        if int(np.concatenate([wakes_of(rows), self._timer_wakes(user)], dtype=np.int64)
               .min(initial=done)) < done:
            out, rows = self.logic.run(key, rows, done, user)
        if rows is not None and not len(rows):
            rows = None
        if rows is None and user.value is None and not user.timers:
            return LogicStep(None, out, np.zeros(0, np.int64))
        wakes = np.union1d(wakes_of(rows), self._timer_wakes(user))
        return LogicStep(Kept(rows, user.value, user.timers or None), out, wakes)

    @staticmethod
    def _timer_wakes(user: _UserBox) -> np.ndarray:
        return np.fromiter(user.timers.values(), np.int64, len(user.timers))
