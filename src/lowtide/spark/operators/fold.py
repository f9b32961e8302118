"""A user's fold (``stream.stateful``) and its timers, as ``transformWithState`` offers
them: a :class:`.slot_logic.RowLogic`, run by :class:`.slot_logic.KeptRows` on the
keyed runtime (:mod:`.keyed_state`).

::

    def visits(key, rows, state, timers):        # one complete slot of the key's rows
        n = (state or 0) + len(rows)
        for t in timers.list_timers():
            timers.delete_timer(t)
        timers.register_timer(timers.event_time_ms() + GAP_MS)   # close after the gap
        return n, None

    def closed(key, expiry_ms, state, timers):    # the timer fired: emit, forget
        return None, pandas.DataFrame({"visits": [state]})

    sessions = stream.stateful(visits, "visits long", key="user", on_timer=closed)

Without ``on_timer`` the fold is ``fn(key, rows, state) -> (state, out)``, called once
per slot with rows of the key, in slot order, once the slot is complete. With it,
``fn`` gets a fourth argument, the key's :class:`Timers` (``register_timer(ms)``,
``delete_timer(ms)``, ``list_timers()``), and ``on_timer(key, expiry_ms, state,
timers) -> (state, out)`` is called when a timer fires; one timer per expiry time.

When a timer fires (``time_mode``):

* ``"EventTime"`` (default): once the step's input is complete through the timer's
  slot (the min time passes it), after that slot's rows, its output at that slot. So a
  timer at ``last + gap`` fires exactly when no row of the key below it can come. A
  timer set for a slot already handled fires right after the call that set it, at its
  slot (set by ``on_timer``: at the next slot, so a timer never re-arms itself in one
  slot).
* ``"ProcessingTime"``: in the first micro-batch whose timestamp is at or past the
  expiry, once the input has moved on from where the timer waits: a pending timer waits
  at the step's min time when it was last looked at (a hold there, rule 7: downstream
  completeness stays there until it fires or moves), its output at that slot.

Each call's outputs sit at its slot; timers of one slot fire in order of expiry. All
of it is a function of (state, rows, ``done``, the batch timestamp): a retried task
fires the same timers with the same outputs.

Worked example (``delta_ms`` 10, event time): rows at slot 4 arrive with ``done`` 3: a
hold at 4. A call with ``done`` 5 runs ``fn`` for slot 4, which registers a timer at
95 ms (slot 9): the hold moves to 9. A call with ``done`` 10 fires it: ``on_timer``'s
rows at slot 9, no hold left.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.spark.operators.slot_logic import AT_COL, RUNTIME_COLS, SLOT_COL, UserState

TIME_MODES = {"eventtime": "EventTime", "event": "EventTime",
              "processingtime": "ProcessingTime", "processing": "ProcessingTime"}
#: timers one ``on_timer`` may chain within one call before the task fails (a timer
#: that re-arms itself for the next slot, for ever, is a bug)
MAX_FIRED = 100_000


def time_mode_of(mode: str, what: str) -> str:
    """``"EventTime"`` or ``"ProcessingTime"`` (Spark's names, or "event",
    "processing", any case)."""
    found = TIME_MODES.get(str(mode).replace("_", "").replace(" ", "").lower())
    if found is None:
        raise ValueError(f"{what}: time_mode={mode!r}: use 'EventTime' (timers fire when "
                         "the min time passes them) or 'ProcessingTime'")
    return found


class Timers:
    """One key's timers in one call of ``fn`` or ``on_timer`` (transformWithState's
    handle, snake_case; the camelCase names work too)."""

    def __init__(self, user: UserState, slot: int, delta_ms: int, mode: str, done: int,
                 in_timer: bool) -> None:
        self._user = user
        self._slot = slot
        self._delta_ms = delta_ms
        self._event = mode == "EventTime"
        self._done = done
        self._in_timer = in_timer

    def register_timer(self, expiry_ms: int) -> None:
        """A timer at ``expiry_ms`` (ms since the epoch; see the module docstring)."""
        t = int(expiry_ms)
        first = self._slot + 1 if self._in_timer else self._slot
        if self._event:
            wake = max(t // self._delta_ms, first)
        else:
            wake = first if t <= self._user.now_ms else max(self._done, first)
        self._user.timers[t] = wake

    def delete_timer(self, expiry_ms: int) -> None:
        self._user.timers.pop(int(expiry_ms), None)

    def list_timers(self) -> list[int]:
        """The expiry times of the key's pending timers, ascending."""
        return sorted(self._user.timers)

    def event_time_ms(self) -> int:
        """Where this call stands in global time: the start of its slot (every row of
        the key before it was handled)."""
        return self._slot * self._delta_ms

    def processing_time_ms(self) -> int:
        """The micro-batch's timestamp."""
        return self._user.now_ms

    registerTimer = register_timer
    deleteTimer = delete_timer
    listTimers = list_timers


@dataclass(frozen=True)
class FoldLogic:
    """A user's ``fn(key, rows, state) -> (state, out)`` (``stream.stateful``): called
    once per slot of the key's rows, in slot order, once the slot is complete; with
    ``on_timer``, ``fn`` also gets the key's :class:`Timers` and ``on_timer(key,
    expiry_ms, state, timers)`` runs when one fires. A :class:`.slot_logic.RowLogic`."""

    fn: Callable[..., tuple[Any, Any]]
    name: str
    on_timer: Callable[..., tuple[Any, Any]] | None = None
    time_mode: str = "EventTime"
    delta_ms: int = 10

    def run(self, key: tuple[Any, ...], rows: Any, done: int, user: UserState
            ) -> tuple[Any, Any]:
        import pandas as pd

        slots = np.zeros(0, np.int64) if rows is None else rows[SLOT_COL].to_numpy()
        frames = {} if rows is None else slot_frames(rows[slots < done])
        todo = list(frames)
        out, fired = [], 0
        while True:
            due = self._due(user, done)
            if todo and (due is None or todo[0] <= due[0]):
                slot = todo.pop(0)
                res = self._call(key, frames[slot], user, slot, done, False)
            elif due is not None:
                slot, expiry = due
                del user.timers[expiry]
                fired += 1
                if fired > MAX_FIRED:
                    raise RuntimeError(f"stateful {self.name!r}: on_timer keeps setting "
                                       "timers for the next slot: set them further ahead")
                res = self._call(key, expiry, user, slot, done, True)
            else:
                break
            if res is not None and len(res):
                out.append(res.reset_index(drop=True).assign(**{AT_COL: int(slot)}))
        self._wait(user, done)
        kept = None if rows is None else rows[slots >= done]
        return (pd.concat(out, ignore_index=True) if out else None), kept

    def provisional(self, key: tuple[Any, ...], rows: Any, state: Any,
                    timers: dict[int, int] | None, done: int, now_ms: int) -> dict[int, Any]:
        """``fn``'s rows (or None) for each slot of the pending ``rows`` (every slot
        ``>= done``), in slot order, as if each slot were complete now: a speculative
        fold's early versions (:mod:`.speculative_fold`). On a copy of the key's state
        and timers: nothing of it is kept, and timers do not fire (they stay
        final-only)."""
        scratch = _Scratch(copy.deepcopy(state), timers or {}, now_ms)
        return {slot: self._call(key, frame, scratch, slot, done, False)
                for slot, frame in slot_frames(rows).items()}

    def _due(self, user: UserState, done: int) -> tuple[int, int] | None:
        """(slot, expiry ms) of the next timer to fire in this call, if any."""
        event = self.time_mode == "EventTime"
        due = [(w, t) for t, w in user.timers.items()
               if w < done and (event or t <= user.now_ms)]
        return min(due) if due else None

    def _wait(self, user: UserState, done: int) -> None:
        """Processing-time timers not yet due wait at the min time (their hold moves)."""
        for t, w in list(user.timers.items()):
            if w < done:
                user.timers[t] = done

    def _call(self, key: tuple[Any, ...], arg: Any, user: UserState, slot: int, done: int,
              in_timer: bool) -> Any:
        """One call of ``fn`` (rows of ``slot``) or ``on_timer`` (an expiry): its rows."""
        if self.on_timer is None:
            res = self.fn(key, arg, user.get_state())
        else:
            timers = Timers(user, slot, self.delta_ms, self.time_mode, done, in_timer)
            fn = self.on_timer if in_timer else self.fn
            res = fn(key, arg, user.get_state(), timers)
        if not (isinstance(res, tuple) and len(res) == 2):
            which = "on_timer" if in_timer else "fn"
            raise ValueError(f"stateful {self.name!r}: {which} must return (state, rows or "
                             "None)")
        user.set_state(res[0])
        return res[1]


def slot_frames(rows: Any) -> dict[int, Any]:
    """Each slot's rows of ``rows`` (sorted by slot), without the runtime's columns, by
    ascending slot: slices (a mask per slot is quadratic in the slots)."""
    if not len(rows):
        return {}
    data = rows.drop(columns=list(RUNTIME_COLS))
    slots, first = np.unique(rows[SLOT_COL].to_numpy(), return_index=True)
    ends = [*first[1:].tolist(), len(rows)]
    return {slot: data.iloc[a:b].reset_index(drop=True)
            for slot, a, b in zip(slots.tolist(), first.tolist(), ends, strict=True)}


class _Scratch:
    """A :class:`.slot_logic.UserState` whose changes are thrown away (a deep copy:
    ``fn`` may change its state in place)."""

    def __init__(self, value: Any, timers: dict[int, int], now_ms: int) -> None:
        self.value = value
        self.timers = dict(timers)
        self.now_ms = now_ms

    def get_state(self) -> Any:
        return self.value

    def set_state(self, value: Any) -> None:
        self.value = value
