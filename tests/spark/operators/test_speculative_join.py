"""Speculative joins without Spark (rule 13): an outer row shows a provisional v1 as
soon as the join receives it, under the hold it keeps; a match cancels it with a
tombstone and emits the pairs (final at once); no match: tombstone v1 and v2 final,
releasing the hold; a retried call emits the same rows with the same child ids; and
over random micro-batches, for every outer join: the finals are the join without
``speculative()`` (a brute-force join), no final is followed by another version, and
the changelog folded after every call holds each waiting outer row once and no
matched one."""

from __future__ import annotations

import pickle
import random
from typing import Any

import numpy as np
import pandas as pd
import pytest

from lowtide import LowtideError
from lowtide.spark.operators.joins import JoinLogic, JoinSpec, check_join
from lowtide.spark.operators.slot_logic import AT_COL, CHILD_COL, WAKE_COL
from lowtide.spark.operators.speculative_join import SpeculativeJoin, make_speculative_join
from lowtide.spark.sinks.changelog import apply_changelog
from tests.spark.operators.groups import Group
from tests.spark.operators.join_rows import Row, brute, frame, sides

COLS = ["k", "l_id", "r_id"]


def speculating(how: str, lower: int, upper: int, window: int = 0) -> SpeculativeJoin:
    return SpeculativeJoin(JoinLogic(("k",), ("l_id",), ("r_id",), lower, upper, how,
                                     window, speculative=True))


def batch(left: list[Row], right: list[Row]) -> pd.DataFrame:
    parts = [f for f in (frame(left, 0), frame(right, 1)) if len(f)]
    return pd.concat(parts, ignore_index=True)


def changes(rows: Any) -> list[tuple[str, int, bool, int, int, int]]:
    """(op, version, is_final, slot, l id, r id; -1 for none) of a call's rows."""
    if rows is None:
        return []
    return [(r["op"], int(r["version"]), bool(r["is_final"]), int(r[AT_COL]),
             int(r["l_id"]) if pd.notna(r["l_id"]) else -1,
             int(r["r_id"]) if pd.notna(r.get("r_id")) else -1) for _, r in rows.iterrows()]


def test_a_left_row_shows_early_and_a_match_cancels_it() -> None:
    g = Group(speculating("left", -2, 2))
    step = g.call(batch([(3, 1, "u")], []), done=1)  # not stepped yet: shown at its slot
    assert changes(step.early) == [("insert", 1, False, 3, 1, -1)] and step.out is None
    assert step.opens.tolist() == [3] and not len(step.releases)  # the hold stays open
    step = g.call(None, done=4)  # stepped, no match yet: its hold moves to 3 + 2
    assert step.early is None and step.out is None
    assert step.opens.tolist() == [5] and step.releases.tolist() == [3]
    step = g.call(batch([], [(4, 7, "u")]), done=4)
    assert step.early is None and step.out is None  # a right row of a left join: no row
    step = g.call(None, done=5)  # the match: tombstone v1 (its hold stays), the pair
    assert changes(step.early) == [("tombstone", 1, False, 5, 1, -1)]
    assert changes(step.out) == [("insert", 1, True, 4, 1, 7)]
    assert 5 in g.holds
    step = g.call(None, done=6)  # decided, matched: nothing more, the hold released
    assert step.early is None and step.out is None and step.releases.tolist() == [5]
    assert not g.holds


def test_an_unmatched_row_ends_with_tombstone_and_final() -> None:
    g = Group(speculating("left", -2, 2))
    g.call(batch([(3, 1, "u")], [(3, 2, "v")]), done=1)
    step = g.call(None, done=6)
    assert changes(step.out) == [("tombstone", 1, False, 5, 1, -1),
                                 ("insert", 2, True, 5, 1, -1)]
    assert step.releases.tolist() == [3, 5] and step.counts.tolist() == [0, 2]
    assert not g.holds and pickle.loads(g.data) is None
    # the tombstone repeats v1 but for op
    first = Group(speculating("left", -2, 2)).call(batch([(3, 1, "u")], []), done=1).early
    cols = [*COLS, "row_id", "version"]
    assert first[cols].reset_index(drop=True).equals(step.out[cols].iloc[[0]]
                                                     .reset_index(drop=True))


def test_a_row_decided_at_its_first_step_showed_v1_when_it_arrived() -> None:
    g = Group(speculating("left", -2, 2))
    g.call(batch([(3, 1, "u")], []), done=3)
    step = g.call(None, done=9)
    assert changes(step.out) == [("tombstone", 1, False, 5, 1, -1),
                                 ("insert", 2, True, 5, 1, -1)]
    g = Group(speculating("left", 0, 0))  # upper 0: decided when stepped
    step = g.call(batch([(3, 1, "u")], []), done=3)
    step = g.call(None, done=4)
    assert changes(step.out) == [("tombstone", 1, False, 3, 1, -1),
                                 ("insert", 2, True, 3, 1, -1)]


def test_a_retried_call_emits_the_same_rows_and_child_ids() -> None:
    g = Group(speculating("full", -2, 2))
    g.call(batch([(3, 1, "u"), (3, 2, "w")], []), done=1)
    first = g.retry(batch([], [(4, 7, "u"), (4, 8, "v")]), done=5)  # an attempt that failed
    again = g.call(batch([], [(4, 8, "v"), (4, 7, "u")]), done=5)  # rows in another order
    for a, b in ((first.early, again.early), (first.out, again.out)):
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    kids = first.early[CHILD_COL].tolist()
    assert len(set(kids)) == len(kids)  # distinct under their holds


def test_a_window_join_shows_outer_rows_until_the_window_closes() -> None:
    g = Group(speculating("anti", 0, 0, window=5))
    step = g.call(batch([(1, 1, "u"), (2, 2, "v")], [(3, 9, "u")]), done=0)
    assert changes(step.early) == [("insert", 1, False, 1, 1, -1),
                                   ("insert", 1, False, 2, 2, -1)]
    step = g.call(None, done=5)  # the window [0, 5) closes: 1 matched, 2 did not
    assert changes(step.out) == [("tombstone", 1, False, 4, 1, -1),
                                 ("tombstone", 1, False, 4, 2, -1),
                                 ("insert", 2, True, 4, 2, -1)]
    assert not g.holds


def test_speculative_join_description_errors() -> None:
    def spec(how: str) -> JoinSpec:
        how, lo, hi = check_join("j", how, 100, within_ms=200)
        return JoinSpec("j", ("k",), lo, hi, how)

    for how, words in (("inner", "nothing to speculate"), ("semi", "nothing to speculate")):
        with pytest.raises(LowtideError, match=words):
            make_speculative_join(spec(how), None)
    with pytest.raises(LowtideError, match="drop every="):
        make_speculative_join(spec("left"), "2 seconds")
    with pytest.raises(LowtideError, match="given twice"):
        make_speculative_join(make_speculative_join(spec("left"), None), None)
    assert make_speculative_join(spec("left_outer"), None).speculative


def drive(logic: Any, left: list[Row], right: list[Row], seed: int
          ) -> list[tuple[list[pd.DataFrame], set[tuple[int, int]]]]:
    """Rows arrive in random batches, the min time jumps ahead at random (as in
    test_joins.run); after each call, the changelog rows so far and the (side, id) of
    the rows received so far."""
    rng = random.Random(seed)
    arrivals = sorted([(s, 0, (s, i, k)) for s, i, k in left]
                      + [(s, 1, (s, i, k)) for s, i, k in right])
    g, done, logs, got, calls = Group(logic), 0, [], set(), []
    while done < 60:
        nxt = min(60, done + rng.randrange(0, 9))
        now = [(side, r) for s, side, r in arrivals if done <= s < nxt + rng.randrange(4)]
        arrivals = [a for a in arrivals if (a[1], a[2]) not in now]
        new = batch([r for sd, r in now if sd == 0], [r for sd, r in now if sd == 1]) \
            if now else None
        got |= {(side, r[1]) for side, r in now}
        step = g.call(new, done=nxt)
        logs = logs + [f for f in (step.out, step.early) if f is not None]
        calls.append((logs, set(got)))
        done = nxt
    assert not arrivals and not g.holds
    kept = pickle.loads(g.data)
    assert kept is None or not (kept.rows[WAKE_COL] >= 0).any()
    return calls


def slots_ids(df: pd.DataFrame) -> list[tuple[int, int, int]]:
    return [(int(r[AT_COL]), int(r["l_id"]) if pd.notna(r["l_id"]) else -1,
             int(r["r_id"]) if pd.notna(r["r_id"]) else -1) for _, r in df.iterrows()]


@pytest.mark.parametrize("how", ["left", "right", "full", "anti"])
@pytest.mark.parametrize(("lo", "hi", "window"), [(-3, 3, 0), (0, 5, 0), (-6, -2, 0),
                                                  (0, 0, 7)])
@pytest.mark.parametrize("seed", range(2))
def test_speculative_join_changelog_folds_to_the_exact_join(how: str, lo: int, hi: int,
                                                           window: int, seed: int) -> None:
    left, right = sides(f"{seed}{lo}{hi}")
    calls = drive(speculating(how, lo, hi, window), left, right, seed)
    rows = pd.concat(calls[-1][0], ignore_index=True)
    if "r_id" not in rows.columns:  # an anti join's rows have the left columns only
        rows["r_id"] = np.nan
    # the finals are the join without speculative(), each once
    finals = slots_ids(rows[rows["is_final"]])
    assert len(finals) == len(set(finals))
    assert set(finals) == brute(left, right, lo, hi, window, how)
    # versions count up per row, a final is the last
    for _, versions in rows.groupby("row_id", sort=False):
        ops = list(zip(versions["op"], versions["version"], versions["is_final"],
                       strict=True))
        assert ops in ([("insert", 1, True)],
                       [("insert", 1, False), ("tombstone", 1, False)],
                       [("insert", 1, False), ("tombstone", 1, False), ("insert", 2, True)])
    # folded after every call: each outer row received shows once, unless it matched
    sides_ = {"left": (0,), "anti": (0,), "right": (1,), "full": (0, 1)}[how]
    for logs, got in calls:
        if not logs:
            continue
        so_far = pd.concat(logs, ignore_index=True)
        if "r_id" not in so_far.columns:
            so_far["r_id"] = np.nan
        latest = apply_changelog(so_far.drop(columns=[AT_COL, CHILD_COL]))  # as written
        assert latest["row_id"].is_unique
        paired = so_far[so_far["l_id"].notna() & so_far["r_id"].notna()]
        alone = latest[latest["l_id"].isna() | latest["r_id"].isna()]
        for side in sides_:
            col = ("l_id", "r_id")[side]
            ids = {i for sd, i in got if sd == side}
            shown = set(alone[col].dropna().astype(int))
            matched = set(paired[col].astype(int)) if how != "anti" else \
                {i for _, i, _ in brute(left, right, lo, hi, window, "semi")}
            assert shown <= ids
            assert ids - matched <= shown
            if how != "anti":
                assert not shown & matched
