"""Speculative folds without Spark (``stateful(...).speculative()``, rule 13): early
versions of each pending (key, slot) under the hold its rows keep open, tombstones of
the version before, the final version released with the hold; a retried call emits the
same rows and child ids; ``fn``'s state is never kept from a provisional call; timers
stay final-only; and a property over random micro-batches with retried calls: the
changelog folded after every call is the latest version of each slot, and at the end
exactly the same fold's output without ``speculative()``."""

from __future__ import annotations

import pickle
import random
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.spark.operators.fold import FoldLogic
from lowtide.spark.operators.slot_logic import AT_COL, CHILD_COL, ID_COL, SLOT_COL, KeptRows
from lowtide.spark.operators.speculative import EARLY_BASE
from lowtide.spark.operators.speculative_fold import SpeculativeFold
from lowtide.spark.sinks.changelog import apply_changelog, finals
from tests.spark.operators.groups import Group

DELTA_MS = 10


def rows(slots: list[int], ids: list[int] | None = None) -> pd.DataFrame:
    ids = ids if ids is not None else list(range(1, len(slots) + 1))
    return pd.DataFrame({"v": np.array(slots, np.int64), SLOT_COL: np.array(slots, np.int64),
                         ID_COL: np.array(ids, np.int64)})


def running(key: Any, new: pd.DataFrame, state: Any) -> tuple[Any, Any]:
    """A running count, and the values seen, in a list changed in place (a user's
    fold may do that: the provisional calls must not keep it)."""
    seen = state if state is not None else []
    seen.extend(new["v"].tolist())
    return seen, pd.DataFrame({"n": [len(seen)], "last": [seen[-1]]})


def speculating(fn: Any = running, every_ms: int = 0, on_timer: Any = None,
                columns: tuple[str, ...] = ("n", "last")) -> SpeculativeFold:
    return SpeculativeFold(FoldLogic(fn, "run", on_timer, "EventTime", DELTA_MS), columns,
                           every_ms)


def changes(frame: Any) -> list[tuple[int, str, int, bool, int]]:
    """(slot, op, version, is_final, n) of a call's early or final rows."""
    if frame is None:
        return []
    return list(zip(frame[AT_COL].tolist(), frame["op"], frame["version"].tolist(),
                    frame["is_final"].tolist(), frame["n"].tolist(), strict=True))


def test_versions_of_two_open_slots_then_tombstones_and_finals() -> None:
    g = Group(speculating())
    step = g.call(rows([3, 5]), done=2)
    assert changes(step.early) == [(3, "insert", 1, False, 1), (5, "insert", 1, False, 2)]
    assert step.out is None and step.opens.tolist() == [3, 5] and not len(step.releases)
    assert pickle.loads(g.data).kept.user is None, "a provisional call's state was kept"
    step = g.call(rows([3], ids=[3]), done=3)  # a late row of slot 3 changes both
    assert changes(step.early) == [(3, "tombstone", 1, False, 1), (3, "insert", 2, False, 2),
                                   (5, "tombstone", 1, False, 2), (5, "insert", 2, False, 3)]
    assert not len(step.opens) and not len(step.releases)
    step = g.call(None, done=3)  # nothing changed: nothing shown, holds stay
    assert step.early is None and step.out is None and g.holds == {3, 5}
    step = g.call(None, done=6)
    assert changes(step.out) == [(3, "tombstone", 2, False, 2), (3, "insert", 3, True, 2),
                                 (5, "tombstone", 2, False, 3), (5, "insert", 3, True, 3)]
    assert step.early is None and step.releases.tolist() == [3, 5]
    assert step.counts.tolist() == [2, 2]
    kept = pickle.loads(g.data)
    assert not g.holds and not kept.shown and kept.kept.user == [3, 3, 5]  # each row once
    assert step.out["slot_start"].tolist() == [pd.Timestamp(t, unit="ms", tz="UTC")
                                               for t in (30, 30, 50, 50)]


def test_a_provisional_call_never_changes_the_committed_state() -> None:
    g = Group(speculating())  # running() extends its state's list in place
    step = g.call(rows([1, 5]), done=2)  # slot 1 final, slot 5 early on a copy of [1]
    assert changes(step.out) == [(1, "insert", 1, True, 1)]
    assert changes(step.early) == [(5, "insert", 1, False, 2)]
    assert pickle.loads(g.data).kept.user == [1]
    step = g.call(rows([5], ids=[3]), done=3)
    assert changes(step.early) == [(5, "tombstone", 1, False, 2), (5, "insert", 2, False, 3)]
    assert changes(g.call(None, done=6).out)[-1] == (5, "insert", 3, True, 3)
    assert pickle.loads(g.data).kept.user == [1, 5, 5]


def test_a_retried_call_emits_the_same_rows_and_child_ids() -> None:
    g = Group(speculating())
    g.call(rows([3, 5]), done=2)
    again = g.retry(rows([3, 5], ids=[3, 4]), done=3)
    step = g.call(rows([3, 5], ids=[3, 4]), done=3)
    pd.testing.assert_frame_equal(again.early, step.early)
    children = step.early[CHILD_COL].to_numpy()
    assert (children >= EARLY_BASE).all()
    for slot in (3, 5):  # distinct under each slot's hold, also from the first call's
        assert len(set(children[step.early[AT_COL] == slot])) == 2


def test_a_version_of_several_rows_is_cancelled_row_by_row() -> None:
    def pairs(key: Any, new: pd.DataFrame, state: Any) -> tuple[Any, Any]:
        return None, pd.DataFrame({"n": [len(new), -len(new)], "last": [0, 0]})

    g = Group(speculating(pairs))
    first = g.call(rows([4]), done=1).early
    second = g.call(rows([4], ids=[2]), done=2).early
    assert second["op"].tolist() == ["tombstone"] * 2 + ["insert"] * 2
    assert len(set(first[CHILD_COL]) | set(second[CHILD_COL])) == 6
    log = pd.concat([first, second], ignore_index=True).drop(columns=[AT_COL, CHILD_COL])
    assert sorted(apply_changelog(log)["n"]) == [-2, 2]


def test_every_bounds_how_often_a_slot_shows_a_version() -> None:
    calls: list[int] = []

    def counted(key: Any, new: pd.DataFrame, state: Any) -> tuple[Any, Any]:
        calls.append(len(new))
        return running(key, new, state)

    g = Group(speculating(counted, every_ms=100))
    assert changes(g.call(rows([5]), done=1, now_ms=0).early) == [(5, "insert", 1, False, 1)]
    assert g.call(rows([5], ids=[2]), done=2, now_ms=50).early is None  # too soon
    assert len(calls) == 2
    assert g.call(None, done=3, now_ms=90).early is None and len(calls) == 2  # not due
    step = g.call(None, done=3, now_ms=120)  # a poll (the step is eager) shows it
    assert changes(step.early) == [(5, "tombstone", 1, False, 1), (5, "insert", 2, False, 2)]
    assert len(calls) == 3
    # once more after `every` (a version shown may have held another back), then no more
    assert g.call(None, done=4, now_ms=400).early is None and len(calls) == 4
    assert g.call(None, done=4, now_ms=600).early is None and len(calls) == 4
    # without every, a call that brings no rows never calls fn provisionally
    g = Group(speculating(counted))
    g.call(rows([5, 7]), done=1)
    g.call(None, done=6)  # slot 5 completes: its real call only
    assert calls[4:] == [1, 1, 1]


def counted_later(key: Any, new: pd.DataFrame, state: Any, timers: Any) -> tuple[Any, Any]:
    """Counts rows, emits nothing; a timer 4 slots after the slot emits the count."""
    timers.register_timer(timers.event_time_ms() + 4 * DELTA_MS)
    return (state or 0) + len(new), None


def emit_count(key: Any, expiry_ms: int, state: Any, timers: Any) -> tuple[Any, Any]:
    return None, pd.DataFrame({"n": [state], "end": [expiry_ms]})


def test_timers_stay_final_only() -> None:
    g = Group(speculating(counted_later, on_timer=emit_count, columns=("n", "end")))
    step = g.call(rows([4]), done=3)  # a provisional call's timer is not kept
    assert step.early is None and step.wakes.tolist() == [4]
    step = g.call(None, done=5)  # slot 4's real call sets it
    assert step.out is None and step.wakes.tolist() == [8]
    step = g.call(None, done=9)  # it fires: its rows are the final version
    assert step.out[["n", "end", "op", "version", "is_final", AT_COL]
                    ].values.tolist() == [[1, 80, "insert", 1, True, 8]]


def test_what_speculative_does_not_take_is_refused_where_it_is_described() -> None:
    import lowtide

    src = lowtide.Pipeline(None).generate(fronts=1).select("seq", "front", name="p")
    bad = [(lambda: src.stateful(running, "n long, `version` long", key="front", name="f")
            .speculative(), r"^stateful 'f': column 'version' is a changelog column "
                            r"\(slot_start, op, version, is_final\): rename it$")]
    fold = src.stateful(running, "n long, last long", key="front", name="f")
    bad += [(lambda: fold.speculative().speculative(),
             r"^stateful 'f': speculative\(\) is given once$"),
            (lambda: fold.speculative(every=-1), r"speculative\(every=-1\) must be >= 0$"),
            (lambda: src.speculative(),
             r"a stateful\(\) or an outer join, not step 'p'"),
            (lambda: fold.speculative().writeStream.outputMode("append"),
             r"speculative\(\) writes a changelog: outputMode\('update'\)")]
    for call, pattern in bad:
        with pytest.raises(lowtide.LowtideError, match=pattern) as err:
            call()
        assert "\n" not in str(err.value)
    assert fold.speculative().writeStream.outputMode("update") is not None


# ------------------------------------------------------------------ property


def drive(logic: Any, items: list[tuple[int, int]], steps: list[int], seed: int
          ) -> list[pd.DataFrame]:
    """Drive one key over ``items`` ((slot, id)) in random micro-batches, each call
    tried once and dropped first (it must return the same); the changelog (or, for a
    plain fold, the output) of each call."""
    rng, g, pending, done, out = random.Random(seed), Group(logic), list(items), 0, []
    for advance in [*steps, 100]:
        nxt = done + advance
        batch = [r for r in pending if r[0] < nxt + rng.randrange(6)]
        pending = [r for r in pending if r not in batch]
        new = rows([s for s, _ in batch], [i for _, i in batch]) if batch else None
        again, step = g.retry(new, nxt, 10 * nxt), g.call(new, nxt, 10 * nxt)
        assert pickle.dumps(again.state) == g.data, "a retried call kept another state"
        for a, b in ((again.out, step.out), (again.early, step.early)):
            assert (a is None) == (b is None)
            if b is not None:
                pd.testing.assert_frame_equal(a, b)
                out.append(b)
        done = nxt
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=25), st.lists(st.integers(0, 8), min_size=1,
                                                           max_size=20),
       st.integers(0, 2), st.integers(0, 10**6))
def test_the_changelog_folds_to_the_latest_version_and_ends_in_the_finals(
        slots: list[int], steps: list[int], every: int, seed: int) -> None:
    items = [(s, i) for i, s in enumerate(slots, start=1)]
    log = drive(speculating(every_ms=every * 40), items, steps, seed)
    latest: dict[int, tuple[int, bool]] = {}
    for frame in log:
        for r in frame.to_dict("records"):
            version, final = latest.get(r[AT_COL], (0, False))
            assert not final, f"a version after the final at slot {r[AT_COL]}"
            if r["op"] == "tombstone":
                assert r["version"] == version
            else:
                assert r["version"] > version
                latest[r[AT_COL]] = (r["version"], bool(r["is_final"]))
    plain = KeptRows(FoldLogic(running, "run", None, "EventTime", DELTA_MS))
    exact = drive(plain, items, steps, seed)
    want = pd.concat(exact, ignore_index=True) if exact else pd.DataFrame(
        {"n": [], "last": [], AT_COL: []})
    got = finals(pd.concat(log, ignore_index=True)) if log else want.iloc[:0]
    cols = ["n", "last", AT_COL]
    assert sorted(got[cols].values.tolist()) == sorted(want[cols].values.tolist())
    assert all(f for f in (v[1] for v in latest.values())), "a slot without its final"
