"""End to end, sessions: ``session_window`` (a fixed gap, per-row gaps) and a
``stateful`` fold closing its sessions with event-time timers, under a lagging front
and injected task failures before and after the step, equal Spark's own batch
``session_window`` over every row the generator labelled (its time: the row's slot);
every session final below the sink's min time is there, none twice. And a fold with
processing-time timers emits each row exactly once, at a slot after it; mistakes in
session windows and groupBy are one line naming the step when the query starts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import lowtide
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once
from tests.spark.operators.helpers import GRID, STUCK_MS, all_input, run_timed, start_fails
from tests.spark.operators.session_checks import (
    GAP,
    GAP_MS,
    SCHEMA,
    SLOTS,
    bursts,
    check_sessions,
    slots_of,
    spark_sessions,
    users_of,
)

pytestmark = pytest.mark.spark

SPEC = GeneratorSpec(fronts=3, rate=150.0, payload_bytes=4, lag_ms={2: 1200})
def failing(stream: Any, step: Any) -> Any:
    """``step`` on ``stream``, with a task failure injected before and after it."""
    before = fail_once(lambda b, p: b % 5 == 3 and p == 0)
    after = fail_once(lambda b, p: b % 4 == 2)
    return step(stream.transform(lambda df: df.mapInArrow(before, df.schema))).transform(
        lambda df: df.mapInArrow(after, df.schema))


# ~12-14 s each: per-row gaps in the slow tier
@pytest.mark.parametrize("per_row", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["fixed", "per_row"])
def test_session_windows_equal_sparks_batch_sessions(spark, tmp_path: Path,
                                                     per_row: bool) -> None:
    """Per row: front 0's rows have a 50 ms gap, the others' 100 ms (given as strings,
    what Spark's ``session_window`` takes)."""
    from pyspark.sql import functions as F

    gap = F.when(F.col("front") == 0, "50 milliseconds").otherwise(GAP) if per_row else GAP
    pipe = lowtide.Pipeline(spark, f"sessions-{per_row}", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = failing(pipe.generate(SPEC).map(bursts, SCHEMA, name="parse"),
                     lambda s: s.session_window(gap, key="user", name="sessions")
                     .agg(n="count", total=("amount", "sum")))
    assert stream.segment_names() == ["parse", "sessions", "sessions.state", "sink"]
    results, t0, final = run_timed(pipe, stream, tmp_path, SLOTS)
    got = results.assign(start=slots_of(results["session_window_start"]),
                         end=slots_of(results["session_window_end"]))
    assert (got["lt_time"] == got["end"]).all(), "a session's row sits at its end"
    horizon = max(final, int(got["end"].max()) + 1)
    rows = users_of(all_input(SPEC, t0, horizon))
    check_sessions(got[["user", "start", "end", "n", "total"]],
                   spark_sessions(spark, rows, gap), final)


def visits(key: Any, rows: pd.DataFrame, state: Any, timers: Any) -> tuple[Any, Any]:
    """transformWithState's sessionization: a session's count, sum and start; its
    timer a gap after its last row."""
    start, n, total = state or (timers.event_time_ms(), 0, 0.0)
    for t in timers.list_timers():
        timers.delete_timer(t)
    timers.register_timer(timers.event_time_ms() + GAP_MS)
    return (start, n + len(rows), total + float(rows["amount"].sum())), None


def closed(key: Any, expiry_ms: int, state: Any, timers: Any) -> tuple[Any, Any]:
    start, n, total = state
    return None, pd.DataFrame({"start": [start // GRID.delta_ms],
                               "end": [expiry_ms // GRID.delta_ms], "n": [n],
                               "total": [total]})


@pytest.mark.slow  # ~19 s; a fold's event-time timers by default: test_fold_timers.py
def test_a_fold_closing_sessions_with_event_time_timers_equals_sparks(spark, tmp_path: Path
                                                                      ) -> None:
    pipe = lowtide.Pipeline(spark, "timer-sessions", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = failing(pipe.generate(SPEC).map(bursts, SCHEMA, name="parse"),
                     lambda s: s.stateful(visits, "start long, end long, n long, "
                                          "total double", key="user", on_timer=closed,
                                          name="sessions"))
    results, t0, final = run_timed(pipe, stream, tmp_path, SLOTS, restart_at=100)
    assert (results["lt_time"] == results["end"]).all(), "a session's row sits at its end"
    horizon = max(final, int(results["end"].max()) + 1)
    rows = users_of(all_input(SPEC, t0, horizon))
    check_sessions(results[["user", "start", "end", "n", "total"]],
                   spark_sessions(spark, rows, GAP), final)


def test_processing_time_timers_emit_each_row_once_after_it(spark, tmp_path: Path) -> None:
    """A fold counts a user's rows and emits the count 300 ms (processing time) after
    the first uncounted one: the counts emitted up to an output's slot are exactly the
    user's rows up to that slot (each row once, none before it arrived). The first
    micro-batch takes the backlog (its timers wait at its min time, which may be far
    past t0): the run goes on 400 slots past where it stands then."""
    def count(key: Any, rows: pd.DataFrame, n: Any, timers: Any) -> tuple[Any, Any]:
        if not timers.list_timers():
            timers.register_timer(timers.processing_time_ms() + 300)
        return (n or 0) + len(rows), None

    def emit(key: Any, expiry_ms: int, n: Any, timers: Any) -> tuple[Any, Any]:
        return None, pd.DataFrame({"n": [n]})

    pipe = lowtide.Pipeline(spark, "proc-timers", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = failing(pipe.generate(SPEC).map(bursts, SCHEMA, name="parse"),
                     lambda s: s.stateful(count, "n long", key="user", on_timer=emit,
                                          time_mode="ProcessingTime", name="count"))
    results, t0, _ = run_timed(pipe, stream, tmp_path, 100, more=400)
    rows = users_of(all_input(SPEC, t0, int(results["lt_time"].max()) + 1))
    assert set(results["user"]) == {"0", "1", "2", "3"}
    for user, got in results.sort_values("lt_time").groupby("user"):
        mine = np.sort(rows.loc[rows["user"] == user, "slot"].to_numpy())
        upto = np.searchsorted(mine, got["lt_time"].to_numpy(), side="right")
        assert (got["n"].cumsum().to_numpy() == upto).all(), user


def test_session_and_group_by_errors_name_the_step(spark, tmp_path: Path) -> None:
    """One line each, when the query starts (the input's schema is known then)."""
    from pyspark.sql import functions as F

    def parsed(s: Any) -> Any:
        return s.map(bursts, SCHEMA, name="parse")

    cases = [
        (lambda s: parsed(s).session_window(F.col("amount"), key="user", name="s").count(),
         r"^session_window 's': the gap column is double: give durations as strings"),
        (lambda s: parsed(s).session_window(F.col("nope"), key="user", name="s").count(),
         r"^session_window 's': gap: .*nope"),
        (lambda s: parsed(s).session_window(GAP, key="nobody", name="s").count(),
         r"^session_window 's': no key column 'nobody' \(columns: front, seq, user, amount"),
        (lambda s: parsed(s).groupBy("user", name="g").agg(x=("nope", "sum")),
         r"^groupBy 'g': aggregate 'x' reads no column 'nope'"),
        (lambda s: parsed(s).groupBy("user", name="g").agg(x=("user", "sum")),
         r"^groupBy 'g': sum of column 'user' \(string\) is not supported"),
    ]
    for describe, message in cases:
        assert re.match(message, start_fails(spark, tmp_path, describe)), message
