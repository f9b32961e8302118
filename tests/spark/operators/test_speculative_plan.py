"""The changelog of a speculative window planned in Spark's JVM, without Spark: the
pure versioning (:func:`changelog_step`) with worked examples, the logic over Spark's
running values (:class:`ChangelogLogic`), the values as they cross from the JVM; and a
property: over random micro-batches, with retried calls, the changelog from Spark's
running values is row for row the one the keyed runtime computes from the rows."""

from __future__ import annotations

import decimal
import pickle
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.core.acks import child_acks
from lowtide.spark.operators.joins import KEY_COL
from lowtide.spark.operators.keyed_state import shuffle_buckets
from lowtide.spark.operators.slot_logic import AT_COL, CHILD_COL, SLOT_COL
from lowtide.spark.operators.speculative import Shown, SpeculativeLogic, changelog_step
from lowtide.spark.operators.speculative_plan import ChangelogLogic, window_values
from lowtide.spark.operators.state_clock import key_hash
from lowtide.spark.operators.window_aggs import bind_aggs
from lowtide.spark.operators.windows import parse_aggs
from tests.spark.operators.groups import AGGS, Group, batch_windows, counting, inputs, rows


def running(values: dict[int, list[Any]], size: int, key: str = "a") -> pd.DataFrame:
    """Spark's update-mode output of one batch as the logic gets it: per changed
    window (start -> [n, s, lo, f, l]) of ``key``, the key's columns, its last slot and
    lt_agg<j> / lt_valid<j>."""
    starts = sorted(values)
    cols: dict[str, Any] = {"k": [key] * len(starts), KEY_COL: [f'{{"k0":"{key}"}}'] * len(starts),
                            SLOT_COL: np.array([s + size - 1 for s in starts], np.int64)}
    for j in range(len(AGGS)):
        got = [values[s][j] for s in starts]
        cols[f"lt_agg{j}"] = np.array([0 if v is None else v for v in got], np.int64)
        cols[f"lt_valid{j}"] = np.array([v is not None for v in got])
    return pd.DataFrame(cols)


def changes(frame: pd.DataFrame | None) -> list[tuple[Any, ...]]:
    if frame is None:
        return []
    return list(zip(frame["op"], frame["version"].tolist(), frame["is_final"].tolist(),
                    frame["n"].tolist(), frame[AT_COL].tolist(), strict=True))


def in_bucket(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    """The keyed runtime's rows of ``key`` as a bucket's logic emits them: the key's
    column first, the child index mixed with the key's hash."""
    out = frame.copy()
    kid = np.array([key_hash(f'{{"k0":"{key}"}}')] * len(out), np.uint64)
    out[CHILD_COL] = child_acks(kid, 0, out[CHILD_COL].to_numpy(np.uint64))
    out.insert(0, "k", pd.Series([key] * len(out), dtype=object))
    return out


def test_versions_follow_the_state_not_the_process() -> None:
    """Worked example: a window shown as v1 shows v2 with v1's tombstone; a window
    that ends at or below done shows its final; nothing changed shows nothing."""
    shown = {0: Shown(1, 100, [2])}
    left, out, early = changelog_step({0: 10, 10: 20}, {0: [2], 10: [5]}.__getitem__,
                                      shown, 5, 200, 0)
    assert out == [] and [(c.start, c.version, c.tombstone) for c in early] == [(10, 1, False)]
    assert left == {0: shown[0], 10: Shown(1, 200, [5])}  # window 0 unchanged: kept
    left, out, early = changelog_step({0: 10, 10: 20}, {0: [3], 10: [5]}.__getitem__,
                                      left, 12, 300, 0)
    assert [(c.start, c.version, c.tombstone, c.final, c.values) for c in out] == [
        (0, 1, True, False, [2]), (0, 2, False, True, [3])]
    assert early == [] and left == {10: Shown(1, 200, [5])}


def test_every_holds_a_change_back_until_a_later_call() -> None:
    shown = {0: Shown(1, 1000, [1])}
    left, _, early = changelog_step({0: 10}, lambda s: [2], shown, 0, 2500, 2000)
    assert early == [] and left == shown
    left, _, early = changelog_step({0: 10}, lambda s: [2], shown, 0, 3000, 2000)
    assert [(c.version, c.tombstone) for c in early] == [(1, True), (2, False)]
    _, out, _ = changelog_step({0: 10}, lambda s: [3], left, 10, 3100, 2000)
    assert [(c.version, c.final) for c in out] == [(2, False), (3, True)]  # never waits


def test_the_logic_over_running_values() -> None:
    """The worked example of :class:`ChangelogLogic`: early versions under the hold at
    the window's last slot, the final releases it."""
    g = Group(ChangelogLogic(AGGS, 10, 10))
    step = g.call(running({0: [2, 10, 3, 3, 7]}, 10), done=2)
    assert changes(step.early) == [("insert", 1, False, 2, 9)] and step.out is None
    assert step.opens.tolist() == [9] and not len(step.releases)
    step = g.call(running({0: [3, 18, 3, 3, 8]}, 10), done=5)
    assert changes(step.early) == [("tombstone", 1, False, 2, 9), ("insert", 2, False, 3, 9)]
    step = g.call(None, done=12)
    assert changes(step.out) == [("tombstone", 2, False, 3, 9), ("insert", 3, True, 3, 9)]
    assert step.releases.tolist() == [9] and not g.holds and pickle.loads(g.data) is None


def test_a_buckets_keys_share_its_holds_not_their_versions() -> None:
    """Worked example, keys a and b in one bucket, their windows [0, 10): one hold at
    slot 9 for both, opened with their first versions and released by their finals;
    each key counts its own versions; early child indices differ between the keys and
    a retried call emits the same rows."""
    g = Group(ChangelogLogic(AGGS, 10, 10))
    both = pd.concat([running({0: [2, 10, 3, 3, 7]}, 10, "a"),
                      running({0: [5, 1, 1, 1, 1]}, 10, "b")], ignore_index=True)
    again, step = g.retry(both, 2, 100), g.call(both, 2, 100)
    pd.testing.assert_frame_equal(again.early, step.early)
    assert step.early["k"].tolist() == ["a", "b"] and step.opens.tolist() == [9]
    assert changes(step.early) == [("insert", 1, False, 2, 9), ("insert", 1, False, 5, 9)]
    assert step.early[CHILD_COL].nunique() == 2
    step = g.call(running({0: [3, 18, 3, 3, 8]}, 10, "a"), 5, 200)
    assert step.early["k"].tolist() == ["a", "a"] and not len(step.opens)
    assert changes(step.early) == [("tombstone", 1, False, 2, 9), ("insert", 2, False, 3, 9)]
    step = g.call(None, 12, 300)
    assert step.out["k"].tolist() == ["a", "a", "b", "b"]
    assert changes(step.out) == [("tombstone", 2, False, 3, 9), ("insert", 3, True, 3, 9),
                                 ("tombstone", 1, False, 5, 9), ("insert", 2, True, 5, 9)]
    assert step.releases.tolist() == [9] and step.counts.tolist() == [4]
    assert not g.holds and pickle.loads(g.data) is None


def test_the_buckets_are_the_checkpoints_shuffle_partitions(tmp_path: Any) -> None:
    """A new checkpoint takes the session's shuffle partitions; a checkpoint with
    batches keeps the ones its last offset log entry names (Spark restores those)."""

    class Conf:
        def get(self, name: str) -> str:
            assert name == "spark.sql.shuffle.partitions"
            return "5"

    class Session:
        conf = Conf()

    assert shuffle_buckets(Session(), str(tmp_path)) == 5
    (tmp_path / "offsets").mkdir()
    assert shuffle_buckets(Session(), str(tmp_path)) == 5
    for batch, n in ((0, 2), (11, 3)):
        (tmp_path / "offsets" / str(batch)).write_text(
            'v1\n{"batchWatermarkMs":0,"conf":{"spark.sql.shuffle.partitions":"' + str(n)
            + '"}}\n{"t0": 1}\n')
    (tmp_path / "offsets" / ".11.crc").write_text("x")
    assert shuffle_buckets(Session(), str(tmp_path)) == 3


def test_values_cross_from_the_jvm_without_loss() -> None:
    """Nulls stay None (not NaN or 0), longs above 2**53 stay exact, NaN stays NaN,
    Decimals and timestamps keep their values."""
    aggs, _ = bind_aggs("w", parse_aggs({"s": ("v", "sum"), "m": ("f", "max"),
                                         "d": ("d", "sum"), "t": ("t", "max")}),
                        {"v": "bigint", "f": "double", "d": "decimal(10,2)", "t": "timestamp"})
    big, ts = 2**62 + 1, pd.Timestamp("2026-11-26 10:00:00.123456", tz="UTC")
    frame = pd.DataFrame({
        "lt_agg0": np.array([big, 0], np.int64), "lt_valid0": [True, False],
        "lt_agg1": [float("nan"), 0.0], "lt_valid1": [True, False],
        "lt_agg2": [decimal.Decimal("1.25"), None], "lt_valid2": [True, False],
        "lt_agg3": pd.Series([ts, pd.NaT]), "lt_valid3": [True, False]})
    first, second = window_values(aggs, frame)
    assert first[0] == big and np.isnan(first[1]) and first[2] == decimal.Decimal("1.25")
    assert first[3] == ts.value and second == [None, None, None, None]


@settings(max_examples=120, deadline=None)
@given(inputs(), st.randoms(use_true_random=False), st.sampled_from([0, 30, 100]))
def test_running_values_give_the_keyed_runtimes_changelog(case: Any, rng: Any, every_ms: int
                                                         ) -> None:
    """Invariant: fed per batch the running values of the windows the batch's rows
    changed (what Spark's update mode hands on), the logic emits exactly the rows
    (versions, tombstones, finals, slots, child ids) and the holds the keyed runtime's
    logic emits from the rows themselves; a retried call emits the same."""
    items, size, slide, steps = case
    items = [(s, i, None if v is None else v >> 22) for s, i, v in items]  # no long overflow
    rows_side = Group(SpeculativeLogic(counting(size, slide), every_ms))
    jvm_side = Group(ChangelogLogic(AGGS, size, 10, every_ms))
    pending, received, done, now = list(items), [], 0, 0
    for advance in [*steps, 100]:
        nxt, now = done + advance, now + 10 * rng.randrange(5)
        batch = [r for r in pending if r[0] < nxt + rng.randrange(6)]
        pending = [r for r in pending if r not in batch]
        received += batch
        touched = batch_windows(batch, size, slide)
        so_far = batch_windows(received, size, slide)
        values = running({s: so_far[s] for s in touched}, size) if batch else None
        again = jvm_side.retry(values, nxt, now)
        got = jvm_side.call(values, nxt, now)
        want = rows_side.call(rows(*(list(c) for c in zip(*batch, strict=True)))
                              if batch else None, nxt, now)
        for a, b, c in ((again.early, got.early, want.early), (again.out, got.out, want.out)):
            assert (a is None) == (b is None) == (c is None)
            if b is not None:
                pd.testing.assert_frame_equal(a, b)
                pd.testing.assert_frame_equal(b, in_bucket(c, "a"))
        assert got.opens.tolist() == want.opens.tolist()
        assert got.releases.tolist() == want.releases.tolist()
        done = nxt
    assert not jvm_side.holds and pickle.loads(jvm_side.data) is None
