"""The driver step (no Spark): its state store (a batch reads the state the batch
before it left, a batch run again reads the same state and min times, and what no
batch can read again goes) and a window's key ranges stepped on the driver."""

from __future__ import annotations

import json
import pickle
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lowtide.core.time import TimeGrid
from lowtide.spark.operators.joins import KEY_COL
from lowtide.spark.operators.slot_logic import SLOT_COL
from lowtide.spark.operators.speculative_driver import (
    ChangelogStore,
    DriverChangelog,
    batch_timestamp_ms,
)
from lowtide.spark.operators.state_clock import StateClock
from lowtide.spark.operators.window_aggs import VALID_PREFIX, VALUE_PREFIX, bind_aggs
from lowtide.spark.operators.window_finals import WindowFinals
from lowtide.spark.operators.windows import Agg
from lowtide.spark.pipeline import Pipeline
from lowtide.spark.tracking.key_ranges import RANGE_HI, RANGE_LO
from lowtide.spark.tracking.transport import TrackerRef

tmp = tempfile.gettempdir()


def test_a_batch_reads_the_state_the_batch_before_it_left(tmp_path: Path) -> None:
    assert ChangelogStore.usable(str(tmp_path), "w")
    store = ChangelogStore(str(tmp_path), "w")
    assert store.load(0) == (-1, {})
    store.save(0, {None: (np.array([9]), {"a": 1})}, -1)
    store.save(1, {None: (np.array([19]), {"a": 2})}, 0)
    read, state = store.load(2)
    assert read == 1 and state[None][1] == {"a": 2}
    # batch 1 run again (a restart before its commit) reads batch 0's state
    read, state = store.load(1)
    assert read == 0 and state[None][1] == {"a": 1}
    store.save(2, {}, 1)  # batch 0's state is read by no batch any more
    assert sorted(p.name for p in store.dir.iterdir()) == ["1", "2"]
    assert store.load(3) == (2, {})


def test_a_state_written_before_key_ranges_is_read_as_range_none(tmp_path: Path) -> None:
    store = ChangelogStore(str(tmp_path), "w")
    store.dir.mkdir(parents=True)
    (store.dir / "4").write_bytes(pickle.dumps((np.array([9]), {"a": 1})))
    (store.dir / "5").write_bytes(pickle.dumps(None))
    read, state = store.load(5)
    assert read == 4 and list(state) == [None] and state[None][1] == {"a": 1}
    assert store.load(6) == (5, {})


def test_a_batch_run_again_steps_with_the_min_times_it_wrote_down(tmp_path: Path) -> None:
    """Rule 5: the min times are read once per batch, after its tasks, and a batch run
    again (a restart before its commit) uses those, not the later, larger ones."""
    store = ChangelogStore(str(tmp_path), "w")
    store.dir.mkdir(parents=True)
    asked = iter([{0: 120, 1: 40}, {0: 999, 1: 999}, {0: 130, 1: 50}])
    assert store.done(3, lambda: next(asked)) == {0: 120, 1: 40}
    assert store.done(3, lambda: next(asked)) == {0: 120, 1: 40}  # the same batch again
    store.save(3, {}, -1)
    assert store.done(4, lambda: next(asked)) == {0: 999, 1: 999}
    store.save(4, {}, 3)  # batch 3 committed: its min times are never read again
    assert sorted(p.name for p in store.dir.iterdir()) == ["3", "4", "done-4"]


def ranged_step() -> tuple[DriverChangelog, StateClock]:
    """A window with two key ranges (front f feeds range f) whose finals the driver
    emits, over a tracker that is never asked (the min times are given)."""
    pipe = Pipeline(spark=None, grid=TimeGrid(10))
    stream = (pipe.generate(fronts=2, rate=10.0)
              .window("100 ms", key="front", key_ranges=2, name="win").agg(n="count"))
    ref = TrackerRef("memory://x", stream.graph(), TimeGrid(10))
    aggs, _ = bind_aggs("win", (Agg("n", "count", None),), {"front": "bigint"})
    logic = WindowFinals(aggs, 10, 10, ("front",))
    step = DriverChangelog("win", logic, "front bigint, window_start timestamp, window_end "
                           "timestamp, n bigint, lt_track long", ref, "sink", 7, str(tmp),
                           key_ranges=2)
    return step, StateClock(ref, "win", "sink", 7)


def changed(rows: list[tuple[int, int, int, int]]) -> pd.DataFrame:
    """Changed (key, window) rows: (front, window's last slot, count, its range)."""
    f, last, n, r = (list(c) for c in zip(*rows, strict=True))
    return pd.DataFrame({"front": f, SLOT_COL: last, KEY_COL: [f"[{x}]" for x in f],
                         f"{VALUE_PREFIX}0": n, f"{VALID_PREFIX}0": [True] * len(f),
                         RANGE_LO: r, RANGE_HI: r})


def test_each_key_range_emits_its_windows_once_it_is_complete() -> None:
    """Rule 15 on the driver: range 0 complete past slot 9 emits front 0's window
    [0, 10) while range 1, behind, keeps front 1's; each result once."""
    step, clock = ranged_step()
    state, frames = step.step(changed([(0, 9, 3, 0), (1, 9, 2, 1)]), {}, {0: 12, 1: 5},
                              1000, clock)
    assert len(frames) == 1 and frames[0]["front"].tolist() == [0]
    assert frames[0]["n"].tolist() == [3]
    assert frames[0]["window_end"].tolist() == [pd.Timestamp("1970-01-01 00:00:00.1", tz="UTC")]
    assert "op" not in frames[0]  # results, not a changelog
    assert sorted(state) == [1]  # range 0 has nothing open
    state, frames = step.step(None, state, {0: 12, 1: 11}, 1100, clock)
    assert [f["front"].tolist() for f in frames] == [[1]] and state == {}


def test_a_key_with_rows_of_two_ranges_is_refused() -> None:
    step, clock = ranged_step()
    mixed = changed([(0, 9, 3, 0)]).assign(**{RANGE_HI: [1]})
    with pytest.raises(ValueError, match="key ranges \\[0, 1\\]"):
        step.step(mixed, {}, {0: 5, 1: 5}, 1000, clock)
    state, _ = step.step(changed([(0, 9, 3, 0)]), {}, {0: 5, 1: 5}, 1000, clock)
    with pytest.raises(ValueError, match="key ranges"):  # the same key, another window
        step.step(changed([(0, 19, 1, 1)]), state, {0: 5, 1: 5}, 1000, clock)


def test_a_checkpoint_that_ran_the_keyed_step_keeps_it(tmp_path: Path) -> None:
    """The plan is chosen once per checkpoint: one with batches but no driver state
    ran the changelog on the keyed runtime, whose state lives in Spark's store."""
    old = tmp_path / "old"
    (old / "offsets").mkdir(parents=True)
    (old / "offsets" / "0").write_text("v1\n{}\n")
    assert not ChangelogStore.usable(str(old), "w")
    new = tmp_path / "new"
    assert ChangelogStore.usable(str(new), "w")
    (new / "offsets").mkdir()
    (new / "offsets" / "0").write_text("v1\n{}\n")
    assert ChangelogStore.usable(str(new), "w")  # its restarts keep the plan


def test_the_batch_timestamp_is_the_offset_logs(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1764000000123, "conf": {}}
    (tmp_path / "offsets" / "4").write_text(f"v1\n{json.dumps(meta)}\n{{}}\n")
    assert batch_timestamp_ms(str(tmp_path), 4) == 1764000000123
