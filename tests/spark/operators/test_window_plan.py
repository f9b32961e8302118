"""The pure parts of windows planned in Spark's JVM, without Spark: stamps, the clock's
offsets, the hold's moves against a core tracker, its write-ahead file after a crash,
and which windows take the fallback."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import Heartbeat, RegisterFront
from lowtide.core.time import TimeGrid
from lowtide.core.tracker import TrackerConfig
from lowtide.spark.operators.window_hold import (
    END,
    LEAD_SLOTS,
    HoldListener,
    HoldRecord,
    WatermarkHold,
    hold_target,
    hops,
    move_acks,
)
from lowtide.spark.operators.window_plan import QueryWindows, fallback_reason
from lowtide.spark.operators.windows import Agg, WindowSpec
from lowtide.spark.sources.clock import clock_offset
from lowtide.spark.tracking.receive import STAMP_MAX_MS, stamp_ms
from lowtide.spark.tracking.transport import TrackerRef, batch_key, register_scheme
from tests.spark.helpers import CoreAgent

GRAPH = SegmentGraph.of(("w", ()), ("w.state", ("w",)), ("out", ("w.state",)))
STATE = GRAPH.index("w.state")


def test_stamps_and_clock_offsets_worked_examples() -> None:
    # a min time of slot 170_000_000_000 at 10 ms slots: the stamp is its start, in ms
    grid = TimeGrid(10, 4)
    assert stamp_ms(170_000_000_000, grid) == 1_700_000_000_000
    # every front finished (closed: its heartbeat is the end of time): the last timestamp,
    # which releases the hold for good (not a hold at END_MS: the sink would stop there)
    assert stamp_ms(grid.end_slot, grid) == STAMP_MAX_MS
    assert stamp_ms(grid.end_slot // 4 * 4, grid) == STAMP_MAX_MS
    assert stamp_ms(grid.end_slot - 4, grid) == (grid.end_slot - 4) * 10
    assert stamp_ms(1 << 62, grid) == STAMP_MAX_MS
    assert hold_target(clock_offset(stamp_ms(grid.end_slot, grid), 300), 10) == END
    # the clock moves by whole slides: between two such times no window can close
    assert clock_offset(1_700_000_001_999, 1000) == 1_700_000_001_000
    assert clock_offset(1_700_000_002_000, 1000) == 1_700_000_002_000


def test_hold_targets_and_hops_worked_examples() -> None:
    # a batch with watermark 12:00:00.005 emitted every window ending at or before it
    assert hold_target(1_700_000_000_005, 10) == 170_000_000_000
    assert hold_target(STAMP_MAX_MS, 10) == END  # released for good
    assert hops(100, 100, 50) == [] and hops(100, 99, 50) == []  # never back
    assert hops(100, 260, 50) == [150, 200, 250, 260]
    release, open_ = move_acks(STATE, 7, 100, 150).count.tolist()
    assert (release, open_) == (-1, 1)
    assert move_acks(STATE, 7, None, 150).count.tolist() == [1]  # the first hold
    assert move_acks(STATE, 7, 150, END).count.tolist() == [-1]  # the last move
    # with the window's slide (1 s): windows not emitted end at 12:00:01 or later, their
    # results at its slot less one: the hold stands there, above the watermark's slot,
    # until the watermark reaches 12:00:01
    assert hold_target(1_700_000_000_005, 10, 1000) == 170_000_000_099
    assert hold_target(1_700_000_000_999, 10, 1000) == 170_000_000_099
    assert hold_target(1_700_000_001_000, 10, 1000) == 170_000_000_199
    assert hold_target(STAMP_MAX_MS, 10, 1000) == END
    # a daily window's next end is up to a day ahead: the hold stays within LEAD_SLOTS
    # of the watermark, where the tracker's checksum table takes its acks
    assert hold_target(1_700_000_000_005, 10, 86_400_000) == 170_000_000_000 + LEAD_SLOTS


@settings(max_examples=300, deadline=None)
@given(wm_ms=st.integers(0, 10**13), delta_ms=st.sampled_from([1, 5, 10, 100]),
       slides=st.one_of(st.integers(1, 50), st.integers(1, 10**7)))
def test_a_hold_by_the_slide_is_safe_and_never_below_the_watermarks(
        wm_ms: int, delta_ms: int, slides: int) -> None:
    """Safety: the hold is at or below the slot of every result not emitted yet (a
    window ending past the watermark, at a multiple of the slide, sends its results at
    its end's slot less one), the first of them unless that is further than LEAD_SLOTS
    past the watermark's own slot; never lower than that slot (the hold without the
    slide)."""
    slide_ms = slides * delta_ms
    target = hold_target(wm_ms, delta_ms, slide_ms)
    first_end = (wm_ms // slide_ms + 1) * slide_ms
    at = hold_target(wm_ms, delta_ms)
    assert first_end > wm_ms
    assert target == min(first_end // delta_ms - 1, at + LEAD_SLOTS)
    assert all(target <= e // delta_ms - 1 for e in range(first_end, first_end + 5 * slide_ms,
                                                            slide_ms))
    assert at <= target <= at + LEAD_SLOTS


def _tracker() -> Any:
    tr = TrackerConfig(GRAPH).build()
    tr.register_front(RegisterFront(front=0, segment="w", time=1_000))
    tr.step(0)
    return tr


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 400), min_size=1, max_size=12), st.integers(1, 40))
def test_out_never_passes_the_hold(steps: list[int], hop: int) -> None:
    """Invariant: while a hold stands at H, the outbound segment's min time is at or
    below H (results not yet emitted are at or above it); after the last move it
    follows the inbound segment (liveness); min times never go back."""
    tr = _tracker()
    hold: int | None = 1_000
    tr.apply(move_acks(STATE, 3, None, hold))
    front = 1_000
    last_out = 0
    for step in steps:
        front += step
        tr.heartbeat(Heartbeat(0, front))
        tr.step(0)
        target = front - step // 2  # the watermark trails the inbound min time
        for slot in hops(hold, target, hop):
            tr.apply(move_acks(STATE, 3, hold, slot))
            hold = slot
            tr.step(0)
            assert tr.min_time("out") <= hold
        out = tr.min_time("out")
        assert out <= hold and out >= last_out
        last_out = out
    tr.apply(move_acks(STATE, 3, hold, END))
    tr.step(0)
    assert tr.min_time("out") == tr.min_time("w") == front


# ---------------------------------------------------------------- the write-ahead file


class HoldAgent(CoreAgent):
    """CoreAgent with the MinTimeAt question the hold asks (the current min time)."""

    def min_time_at(self, segment: str | None, at_ms: int, timeout_s: float = 30.0) -> int:
        with self.lock:
            self.tracker.step(0)
            return self.tracker.min_time(segment)


@pytest.fixture
def agent() -> Any:
    a = HoldAgent(GRAPH, TimeGrid())
    a.tracker.register_front(RegisterFront(front=0, segment="w", time=1_000))
    register_scheme("holdtest", lambda ref: a)
    yield a
    register_scheme("holdtest", None)


def _hold(tmp: Path) -> WatermarkHold:
    return WatermarkHold(TrackerRef("holdtest://x", GRAPH), "w", 3, str(tmp))


def test_a_move_cut_short_by_a_crash_is_finished_once(agent: Any, tmp_path: Path) -> None:
    hold = _hold(tmp_path)
    hold.prepare()
    assert hold.ensure_open() and hold.record.hold == 1_000
    hold.advance(1_500 * 10)  # watermark at slot 1_500
    assert hold.record == HoldRecord(hold.record.key, True, 1_500, None)
    # a crash after the move's keyed batch was applied, before the file said so
    record = json.loads(Path(hold.path).read_text())
    Path(hold.path).write_text(json.dumps({**record, "hold": 1_500, "pending": 1_800}))
    agent.send_batch(batch_key(record["key"], 1_800, "<hold>w", 0),
                     move_acks(STATE, 3, 1_500, 1_800))
    again = _hold(tmp_path)
    again.prepare()  # re-sends the same keyed batch: applied at most once
    assert again.record.hold == 1_800 and again.record.pending is None
    agent.tracker.heartbeat(Heartbeat(0, 5_000))
    assert agent.step()["out"] == 1_800  # one hold, at 1_800: not released twice


def test_a_move_is_written_down_durably_before_it_is_sent(
        agent: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write-ahead is synced before the move is sent, its completion after: an
    unsynced rename could leave an empty file after a machine crash (rule 14)."""
    hold = _hold(tmp_path)
    hold.prepare()
    hold.ensure_open()
    synced: list[dict[str, Any]] = []
    fsync = os.fsync

    def watched(fd: int) -> None:
        fsync(fd)
        synced.append(json.loads(Path(f"{hold.path}.{os.getpid()}.tmp").read_text()))

    monkeypatch.setattr(os, "fsync", watched)
    send = agent.send_batch

    def sent(*args: Any, **kwargs: Any) -> Any:
        synced.append({"sent": True})
        return send(*args, **kwargs)

    monkeypatch.setattr(agent, "send_batch", sent)
    hold.advance(1_500 * 10)
    # write-ahead synced, sent, completion synced
    assert [(s.get("pending"), s.get("sent")) for s in synced] == [
        (1_500, None), (None, True), (None, None)]
    assert json.loads(Path(hold.path).read_text())["hold"] == 1_500


def test_the_first_hold_waits_for_a_front(tmp_path: Path) -> None:
    a = HoldAgent(GRAPH, TimeGrid())  # no front registered yet: min times are 0
    register_scheme("holdtest", lambda ref: a)
    try:
        hold = _hold(tmp_path)
        hold.prepare()
        assert not hold.ensure_open(wait_s=0.05)  # not at slot 0, where no move could go
        a.tracker.register_front(RegisterFront(front=0, segment="w", time=2_000))
        assert hold.ensure_open() and hold.record.hold == 2_000
    finally:
        register_scheme("holdtest", None)


def test_the_fallback_is_chosen_where_the_pipeline_is_described() -> None:
    agg = WindowSpec("w", ("k",), 1000, 1000, (Agg("n", "count", None),))
    assert fallback_reason(agg, 1) is None
    assert "another stateful step" in str(fallback_reason(agg, 2))
    applied = WindowSpec("w", ("k",), 1000, 1000, (), fn=lambda rows: {}, fn_schema="x long")
    assert "apply(fn)" in str(fallback_reason(applied, 1))
    # a window per key range: each range's windows come out when that range completes
    ranged = WindowSpec("w", ("k",), 1000, 1000, (Agg("n", "count", None),), key_ranges=4)
    assert "key_ranges" in str(fallback_reason(ranged, 1))
    assert fallback_reason(ranged, 1, on_driver=True) is None  # its finals on the driver
    # a retry step sends into the window without the senders' stamps (its e2e test failed
    # with "dropped the column 'lt_wm'")
    assert "retry loop" in str(fallback_reason(agg, 1, loop=True))


def test_which_plan_a_key_range_window_gets(tmp_path: Path) -> None:
    """On the driver (Spark aggregates, the sink's foreachBatch emits each range's
    windows) only as the query's last step, started by lowtide's sink, from a new
    checkpoint or one that ran that plan; otherwise the keyed runtime."""
    from lowtide.spark.pipeline import Pipeline

    pipe = Pipeline(spark=None, grid=TimeGrid(10))
    last = (pipe.generate(fronts=2, rate=10.0)
            .window("1 second", key="front", key_ranges=2, name="win").agg(n="count"))
    after = last.transform(lambda df: df, name="after")
    spec = last.steps[-1]

    def on_driver(stream: Any, ckpt: Path | None, started: bool = True) -> bool:
        return QueryWindows.of(stream, None if ckpt is None else str(ckpt),
                               started).in_jvm(spec)

    assert on_driver(last, tmp_path / "new")
    assert (tmp_path / "new" / "lowtide" / "changelog-win").is_dir()
    assert not on_driver(after, tmp_path / "a")  # steps after it run on its rows
    assert not on_driver(last, tmp_path / "b", started=False)  # build(): a caller's sink
    assert not on_driver(last, None)  # no checkpoint
    old = tmp_path / "old"  # a checkpoint that ran the keyed runtime keeps it
    (old / "offsets").mkdir(parents=True)
    (old / "offsets" / "0").write_text("v1\n{}\n")
    assert not on_driver(last, old)


def test_which_plan_a_window_without_key_ranges_gets(tmp_path: Path) -> None:
    """Always Spark's aggregation; its results from the driver as the query's last step
    into a sink that runs ``foreachBatch`` anyway (Parquet, a table, a function), from a
    new checkpoint or one that ran that plan; otherwise (the null sink, steps after it,
    a caller's sink, a checkpoint that ran the emit step) the emit step in the JVM."""
    from lowtide.spark.pipeline import Pipeline

    pipe = Pipeline(spark=None, grid=TimeGrid(10))
    last = pipe.generate(fronts=2, rate=10.0).window("1 second", key="front",
                                                    name="win").agg(n="count")
    after = last.transform(lambda df: df, name="after")
    spec = last.steps[-1]

    def plan(stream: Any, ckpt: Path, started: bool = True, null: bool = False) -> str:
        qw = QueryWindows.of(stream, str(ckpt), started, null)
        assert qw.in_jvm(spec)
        return "driver" if qw.on_driver(spec) else "emit"

    assert plan(last, tmp_path / "new") == "driver"
    assert QueryWindows.of(last, str(tmp_path / "new"), True).ends_in_window(last) is False
    assert plan(last, tmp_path / "null", null=True) == "emit"
    assert QueryWindows.of(last, str(tmp_path / "null"), True, True).ends_in_window(last)
    assert plan(after, tmp_path / "a") == "emit"
    assert plan(last, tmp_path / "b", started=False) == "emit"
    old = tmp_path / "old"  # a checkpoint that ran the emit step keeps it
    (old / "offsets").mkdir(parents=True)
    (old / "offsets" / "0").write_text("v1\n{}\n")
    assert plan(last, old) == "emit"
    assert plan(last, tmp_path / "new") == "driver"  # its restarts keep the plan


def test_a_daily_windows_hold_stays_where_the_tracker_takes_it(agent: Any,
                                                               tmp_path: Path) -> None:
    """A window's hold stands at its next result slot past the watermark, but a daily
    window's next end may be millions of slots ahead, past the tracker's checksum
    table (2**20 windows from the segment's oldest open one): it stands at most
    LEAD_SLOTS past the watermark's slot, and the outbound segment stays below it."""
    hold = WatermarkHold(TrackerRef("holdtest://x", GRAPH), "w", 3, str(tmp_path),
                         slide_ms=86_400_000)
    hold.prepare()
    assert hold.ensure_open() and hold.record.hold == 1_000
    hold.advance(1_500 * 10)  # watermark at slot 1_500; the next day ends at 8_640_000
    assert hold.record.hold == 1_500 + LEAD_SLOTS and hold.record.pending is None
    agent.tracker.heartbeat(Heartbeat(0, 9_000_000))
    assert agent.step()["out"] == 1_500 + LEAD_SLOTS


def test_a_stopped_query_moves_no_hold(agent: Any, tmp_path: Path) -> None:
    """After its query stopped, a late progress event moves nothing: its tracker may
    be closed next, and a move blocked on it would hold up the session's listeners."""
    hold = _hold(tmp_path)
    hold.prepare()
    assert hold.ensure_open() and hold.record.hold == 1_000
    hold.close()
    hold.advance(1_500 * 10)
    assert hold.record.hold == 1_000 and agent.step()["out"] == 1_000


def test_a_listener_added_after_its_query_ran_catches_up_with_its_last_progress() -> None:
    """Added after its query started, the listener may have missed every batch (a
    finished input): catching up with the query's last progress moves the hold to its
    watermark; before any batch ended there is nothing to catch up with."""
    from types import SimpleNamespace

    moved: list[int] = []
    hold: Any = SimpleNamespace(window="w", advance=lambda wm, wait_s: moved.append(wm))
    listener = HoldListener(hold, "a")
    listener.catch_up(None)
    listener.catch_up(SimpleNamespace(eventTime={}))  # a batch with no watermark yet
    assert moved == []
    listener.catch_up(SimpleNamespace(eventTime={"watermark": "2023-11-14T22:13:20.005Z"}))
    assert moved == [1_700_000_000_005]


def test_a_rows_time_is_its_full_slot_and_a_far_row_fails_its_task() -> None:
    """The receive step's ``lt_ts`` is the row's full slot times ``delta_ms``, unwrapped
    against the task's clock (a source's rows may be days from it), and a row too far
    from the clock to be unwrapped surely fails the task."""
    import pyarrow as pa

    from lowtide.spark.tracking import pack
    from lowtide.spark.tracking.column import HELD_RANGE, PACK_RANGE
    from lowtide.spark.tracking.receive import TS_COL, with_time

    grid = TimeGrid(10)
    now = 170_000_000_000
    slots = np.array([now - PACK_RANGE + 1, now, now + 3], np.int64)
    packed = pack(slots, np.arange(1, 4, dtype=np.uint64), now)
    batch = with_time(pa.record_batch({"x": [1, 2, 3]}), packed, now, grid)
    micros = batch.column(TS_COL).cast(pa.int64()).to_numpy()
    assert micros.tolist() == (slots * 10_000).tolist()
    with pytest.raises(ValueError, match="cannot be tracked"):
        with_time(batch, packed[:1], now + HELD_RANGE, grid)


def test_the_receive_steps_columns_leave_the_window_no_null_filter(spark: Any) -> None:
    """``lt_ts`` cannot be null (the receive step's schema says so), so the window's
    test for a row without a time is not planned."""
    from pyspark.sql import functions as F

    from lowtide.spark.operators.window_input import with_stamp

    df = spark.createDataFrame([(1, 2, datetime(2026, 1, 1), 0)],
                               with_stamp("k long, lt_track long"))
    assert not df.schema["lt_ts"].nullable and not df.schema["lt_wm"].nullable
    windowed = df.groupBy(F.window("lt_ts", "1 second")).count()
    assert "isnotnull" not in windowed._jdf.queryExecution().optimizedPlan().toString()
    assert windowed.collect()[0]["count"] == 1


def test_a_windows_input_is_the_users_columns_and_lowtides_names_are_refused(
        spark: Any) -> None:
    """lowtide's own columns are not the user's; a user's column with one of the names
    lowtide uses (``lt_ts`` too, next to the receive step's) fails where the pipeline
    is described, in one line (both window plans read their input this way)."""
    from lowtide.spark.operators.window_input import with_stamp
    from lowtide.spark.operators.window_plan import input_fields

    ours = spark.createDataFrame([], with_stamp("k long, lt_track long"))
    assert input_fields(ours, "window 'w'") == {"k": "bigint"}
    users = [spark.createDataFrame([], with_stamp("k long, lt_window long, lt_track long")),
             spark.range(1).mapInArrow(lambda it: it, with_stamp("id long, lt_ts timestamp"))]
    for df, name in zip(users, ("lt_window", "lt_ts"), strict=True):
        with pytest.raises(ValueError, match=f"column '{name}' is a name lowtide uses"):
            input_fields(df, "window 'w'")
