"""Speculative windows without Spark (rule 13): early versions and their tombstones at
the window's last slot under a hold that stays open, the final version released with
the hold, versions from state (a retried call emits the same), the re-emit bound; and
a property over random micro-batches: the changelog folded after every call is the
latest version of each window, and at the end exactly the exact windows."""

from __future__ import annotations

import pickle
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.spark.operators.slot_logic import AT_COL, CHILD_COL, GroupStep
from lowtide.spark.operators.speculative import (
    EARLY_BASE,
    SpeculativeLogic,
    make_speculative,
)
from lowtide.spark.operators.windows import WindowSpec, parse_aggs
from tests.spark.operators.groups import Group, batch_windows, counting, inputs, rows

COLS = ["n", "s", "lo", "f", "l"]


def speculating(size: int, slide: int | None = None, every_ms: int = 0) -> SpeculativeLogic:
    return SpeculativeLogic(counting(size, slide), every_ms)


def changes(step: GroupStep, which: str = "early") -> list[tuple[str, int, bool, int]]:
    """(op, version, is_final, n) of a call's early or final rows."""
    rows_ = step.early if which == "early" else step.out
    if rows_ is None:
        return []
    return list(zip(rows_["op"], rows_["version"].tolist(), rows_["is_final"],
                    rows_["n"].tolist(), strict=True))


def test_early_versions_sit_under_the_hold_the_final_releases() -> None:
    g = Group(speculating(10))
    step = g.call(rows([3, 7]), done=2)
    assert changes(step) == [("insert", 1, False, 2)] and step.out is None
    assert step.opens.tolist() == [9] and not len(step.releases)  # the hold stays open
    assert step.early[AT_COL].tolist() == [9]
    step = g.call(rows([8], ids=[3]), done=5)
    assert changes(step) == [("tombstone", 1, False, 2), ("insert", 2, False, 3)]
    assert not len(step.opens) and not len(step.releases)
    step = g.call(None, done=7)  # nothing changed: nothing shown
    assert step.early is None and step.out is None
    step = g.call(None, done=12)
    assert changes(step, "out") == [("tombstone", 2, False, 3), ("insert", 3, True, 3)]
    assert step.releases.tolist() == [9] and step.counts.tolist() == [2]
    assert not g.holds and pickle.loads(g.data) is None


def test_versions_have_distinct_deterministic_child_ids() -> None:
    g = Group(speculating(10))
    g.call(rows([3]), done=0)
    again = g.retry(rows([4], ids=[2]), done=1)
    step = g.call(rows([4], ids=[2]), done=1)
    pd.testing.assert_frame_equal(again.early, step.early)
    assert step.early[CHILD_COL].tolist() == [EARLY_BASE + 2 + 1, EARLY_BASE + 4]


def test_every_bounds_how_often_a_window_shows_a_new_version() -> None:
    g = Group(speculating(10, every_ms=2000))
    assert changes(g.call(rows([1]), done=0, now_ms=1000)) == [("insert", 1, False, 1)]
    assert g.call(rows([2], ids=[2]), done=0, now_ms=2500).early is None  # too soon
    step = g.call(None, done=0, now_ms=3000)  # a poll: the held-back change shows
    assert changes(step) == [("tombstone", 1, False, 1), ("insert", 2, False, 2)]
    step = g.call(rows([3], ids=[3]), done=12, now_ms=3100)  # the final never waits
    assert changes(step, "out") == [("tombstone", 2, False, 2), ("insert", 3, True, 3)]


def test_a_window_complete_at_its_first_call_is_one_final_row() -> None:
    step = Group(speculating(10)).call(rows([3, 7]), done=20)
    assert changes(step, "out") == [("insert", 1, True, 2)] and step.early is None


@pytest.mark.parametrize("fix", [
    (lambda w: w, None),
    (lambda w: WindowSpec("w", ("op",), 100, 100, parse_aggs({"n": "count"})), "'op'"),
])
def test_speculative_is_checked_where_it_is_described(fix: Any) -> None:
    make, error = fix
    window = WindowSpec("w", ("k",), 100, 100, parse_aggs({"n": "count"}))
    if error is None:
        assert make_speculative(make(window), "2 seconds").every_ms == 2000
        return
    with pytest.raises(ValueError, match=error):
        make_speculative(make(window), None)


def test_speculative_after_anything_but_a_window_agg_is_refused() -> None:
    import lowtide

    src = lowtide.Pipeline(None).generate(fronts=1)
    for stream, message in ((src, "an outer join, not the source"),
                            (src.select("seq", name="s"), "not step 's'")):
        with pytest.raises(lowtide.LowtideError, match=message) as err:
            stream.speculative()
        assert "\n" not in str(err.value)


class Folded:
    """A changelog folded as a reader folds it: the latest version of each window
    (start -> (version, values, is final)), checking it on the way."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.latest: dict[int, tuple[int, list[Any], bool]] = {}
        self.versions: dict[int, int] = {}  # start -> the last version seen

    def apply(self, out: pd.DataFrame | None) -> None:
        for r in [] if out is None else out.to_dict("records"):
            start = r["window_start"].value // 10_000_000
            assert r[AT_COL] == start + self.size - 1, "a row at another time than its hold"
            values = [r["n"], *(None if pd.isna(r[c]) else r[c] for c in COLS[1:])]
            have = self.latest.get(start)
            assert have is None or not have[2], "a version after the final"
            if r["op"] == "tombstone":
                assert have is not None and (have[0], have[1]) == (r["version"], values)
                del self.latest[start]
                continue
            assert have is None, "an insert over a version not cancelled"
            assert r["version"] == self.versions.get(start, 0) + 1, "a version skipped"
            self.versions[start] = r["version"]
            self.latest[start] = (r["version"], values, bool(r["is_final"]))


@settings(max_examples=120, deadline=None)
@given(inputs(), st.randoms(use_true_random=False), st.sampled_from([0, 30, 100]))
def test_the_changelog_folds_into_the_exact_windows(case: Any, rng: Any, every_ms: int
                                                   ) -> None:
    """Invariants: a tombstone cancels the latest version with its values; versions
    follow each other; nothing follows a final; a retried call emits the same rows
    and keeps the same state; after every call the latest versions are the windows'
    values so far (the early ones may lag by ``every``), and at the end every window
    is final with the batch recomputation's values; no hold is left."""
    items, size, slide, steps = case
    g = Group(speculating(size, slide, every_ms))
    folded = Folded(size)
    pending, done, now = list(items), 0, 0
    for advance in [*steps, 100]:
        nxt, now = done + advance, now + 10 * rng.randrange(5)
        batch = [r for r in pending if r[0] < nxt + rng.randrange(6)]
        pending = [r for r in pending if r not in batch]
        new = rows(*(list(c) for c in zip(*batch, strict=True))) if batch else None
        step = g.retried_call(new, nxt, now)
        folded.apply(step.out)
        folded.apply(step.early)
        seen = batch_windows([r for r in items if r not in pending], size, slide)
        for start, (_, values, final) in folded.latest.items():
            assert final == (start + size <= nxt)
            assert every_ms or values == seen[start], "the latest version is not current"
        done = nxt
    assert {s: v for s, (_, v, _) in folded.latest.items()} == batch_windows(items, size, slide)
    assert all(final for _, _, final in folded.latest.values())
    assert not g.holds and pickle.loads(g.data) is None
