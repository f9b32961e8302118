"""End to end, a speculative left outer interval join (rule 13) under a lagging front,
injected task failures (before the join on one side, after it) and a restart from the
checkpoint: the changelog folded after every batch is the latest state (a tombstone
names the live version of its row and repeats it, versions follow each other, nothing
follows a final), left rows showed early and were cancelled by a match or ended final,
and the finals equal a batch recomputation of the same events (the join without
``speculative()``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import lowtide
from lowtide.spark.sinks.changelog import apply_changelog, finals
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once
from tests.spark.operators.changelogs import ByBatch
from tests.spark.operators.helpers import GRID, STUCK_MS, all_input
from tests.spark.operators.join_rows import WITHIN, as_rows, batch_join, check_equal, side

pytestmark = pytest.mark.spark
VALUES = ["user", "l_front", "l_seq", "r_front", "r_seq"]


def fold(frames: list[pd.DataFrame]) -> dict[int, tuple[int, bool, bool]]:
    """Fold the changelog batch by batch as a reader would, checking it, and against
    :func:`apply_changelog` after each batch; row_id -> (latest version, is final,
    live: not cancelled)."""
    live: dict[int, tuple[int, bool, tuple[Any, ...]]] = {}
    for n, rows in enumerate(frames):
        for r in rows.sort_values(["version", "op"], ascending=[True, False]).to_dict(
                "records"):
            rid, values = int(r["row_id"]), tuple(-1 if pd.isna(r[c]) else r[c] for c in VALUES)
            have = live.get(rid)
            assert have is None or not have[1], f"a version after the final: {rid}"
            if r["op"] == "tombstone":
                assert have is not None and have[0] == r["version"] and have[2] == values
                live[rid] = (have[0], False, ())
            else:
                assert r["version"] == (have[0] + 1 if have else 1), f"a version skipped {rid}"
                live[rid] = (int(r["version"]), bool(r["is_final"]), values)
        folded = apply_changelog(pd.concat(frames[:n + 1], ignore_index=True))
        assert sorted(folded["row_id"]) == sorted(k for k, v in live.items() if v[2])
    return {k: (v, f, bool(values)) for k, (v, f, values) in live.items()}


def run_changelog(spark: Any, tmp_path: Path, restart_at: int, slots: int
                  ) -> tuple[ByBatch, GeneratorSpec, GeneratorSpec, int, int]:
    """A left join of a lagging 2-front left side, with task failures before and after
    the join, to a sparse right side, ``.speculative()``, written by ``foreach_batch``
    until the sink is ``slots`` past t0, stopped and restarted from the checkpoint at
    ``restart_at``; (the sink, both sides' specs, t0, the final min time)."""
    t0 = int(time.time() * 1000) + 1000
    a = GeneratorSpec(fronts=2, rate=120.0, payload_bytes=4, lag_ms={1: 800}, t0_ms=t0)
    b = GeneratorSpec(fronts=1, first_front=2, rate=10.0, payload_bytes=4, t0_ms=t0)
    pipe = lowtide.Pipeline(spark, "spec-join", grid=GRID, stuck_after_ms=STUCK_MS)
    before = fail_once(lambda bid, p: bid % 5 == 3 and p == 0)
    after = fail_once(lambda bid, p: bid % 4 == 2)
    left = (pipe.generate(a).map(side("l_"), "user string, l_front int, l_seq long",
                                 name="left")
            .transform(lambda df: df.mapInArrow(before, df.schema)))
    right = pipe.generate(b).map(side("r_"), "user string, r_front int, r_seq long",
                                 name="right")
    changes = (left.join(right, on="user", within=f"{WITHIN * GRID.delta_ms} milliseconds",
                         how="left", name="j").speculative()
               .transform(lambda df: df.mapInArrow(after, df.schema)))
    sink, ckpt = ByBatch(("row_id", "version", "op")), tmp_path / "ckpt"

    def start() -> Any:
        return changes.foreach_batch(sink, checkpoint=str(ckpt), keep_tracking_columns=True,
                                     trigger="200 milliseconds")

    try:
        query = start()
        query.wait_for_min_time(GRID.slot_of(t0) + restart_at, timeout_s=120)
        query.stop()  # outer rows shown early stay in the state store, held
        query = start()
        query.wait_for_min_time(GRID.slot_of(t0) + slots, timeout_s=120)
        assert not query.stuck()
        query.stop()
        final = query.min_time()
    finally:
        pipe.close()
    return sink, a, b, t0, final


@pytest.mark.slow  # ~10 s; the changelog of a join by default: test_speculative_join.py
def test_speculative_left_join_under_lag_failures_and_a_restart(spark, tmp_path: Path
                                                               ) -> None:
    sink, a, b, t0, final = run_changelog(spark, tmp_path, 100, 250)
    assert not sink.rerun_differs
    frames = [sink.batches[i] for i in sorted(sink.batches)]
    latest = fold(frames)
    rows = pd.concat(frames, ignore_index=True)
    assert list(rows.columns[:9]) == [*VALUES, "row_id", "op", "version", "is_final"]
    early = rows[~rows["is_final"] & (rows["op"] == "insert")]
    assert len(early) and (rows["version"] == 2).any(), "no row ended final after v1"
    assert any(not live for _, _, live in latest.values()), "no early row cancelled by a match"
    exact = finals(rows).rename(columns={"lt_time": "time"})
    check_equal(as_rows(exact), final,
                lambda h: batch_join(all_input(a, t0, h), all_input(b, t0, h), "left", 0))
    assert len(exact) == sum(f for _, f, _ in latest.values())


def test_speculative_join_errors_where_described(spark, tmp_path: Path) -> None:
    pipe = lowtide.Pipeline(spark, "spec-join-bad", grid=GRID)
    try:
        left = pipe.generate(fronts=1, rate=10.0).map(
            side("l_"), "user string, l_front int, l_seq long", name="left")
        right = pipe.generate(fronts=1, first_front=1, rate=10.0).map(
            side("r_"), "user string, r_front int, r_seq long", name="right")
        for how, every, words in (("inner", None, "nothing to speculate"),
                                  ("left_semi", None, "nothing to speculate"),
                                  ("left", "1 second", "drop every=")):
            with pytest.raises(lowtide.LowtideError, match=words) as err:
                left.join(right, on="user", within="100 milliseconds", how=how
                          ).speculative(every)
            assert "\n" not in str(err.value)
        clash = left.withColumnRenamed("l_seq", "row_id").join(
            right, on="user", within="100 milliseconds", how="left").speculative()
        with pytest.raises(ValueError, match="'row_id' is a changelog column") as err:
            clash.to_null(checkpoint=str(tmp_path / "ckpt"))
        assert "\n" not in str(err.value)
    finally:
        pipe.close()
