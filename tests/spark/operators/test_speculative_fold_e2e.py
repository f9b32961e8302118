"""End to end, a speculative fold (``stateful(...).speculative()``, rule 13): under a
lagging front and injected task failures before and after the step, across a restart
from the checkpoint, the changelog folded after every batch is the latest version of
each (user, slot) (tombstones cancel the version they name, versions rise, nothing
follows a final), every row sits at its slot, a batch run again writes the same rows,
and at the end the finals are exactly the batch fold of the whole input (what the
same ``stateful`` without ``speculative()`` emits, test_keyed_state_e2e)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import lowtide
from lowtide.spark.sinks.changelog import apply_changelog, finals
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once, t0_of_checkpoint
from tests.spark.operators.helpers import GRID, SCHEMA, STUCK_MS, all_input, parse
from tests.spark.operators.test_keyed_state_e2e import batch_fold, running

pytestmark = pytest.mark.spark
OUT = "n long, total double, rows long"


class ByBatch:
    """A ``foreach_batch`` function that keeps each batch's rows by batch id, as an
    idempotent sink does, and records any batch run again with other rows."""

    def __init__(self) -> None:
        self.batches: dict[int, pd.DataFrame] = {}
        self.rerun_differs: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        cols = ["user", "slot_start", "version", "op"]
        rows = df.toPandas().sort_values(cols).reset_index(drop=True)
        with self._lock:
            before = self.batches.get(batch_id)
            if before is not None and not before.equals(rows):
                self.rerun_differs.append(batch_id)
            self.batches[batch_id] = rows


def slots_of(rows: pd.DataFrame) -> pd.Series:
    ms = pd.to_datetime(rows["slot_start"], utc=True).map(lambda t: t.value // 1_000_000)
    return ms // GRID.delta_ms


def fold_batches(frames: list[pd.DataFrame]) -> dict[tuple[str, int], tuple[int, bool]]:
    """Fold the changelog batch by batch as a reader would, checking it; after each
    batch :func:`apply_changelog` keeps exactly the latest version of each (user,
    slot). Returns (user, slot) -> (latest version, is final)."""
    latest: dict[tuple[str, int], tuple[int, bool, tuple[Any, ...]]] = {}
    seen: list[pd.DataFrame] = []
    for rows in frames:
        if not len(rows):
            continue
        seen.append(rows)
        rows = rows.assign(slot=slots_of(rows))
        assert (rows["lt_time"] == rows["slot"]).all(), "a row not at its slot"
        for r in rows.sort_values(["version", "op"]).to_dict("records"):
            key, values = (r["user"], r["slot"]), (r["n"], r["total"], r["rows"])
            have = latest.get(key)
            assert have is None or not have[1], f"a version after the final: {key}"
            if r["op"] == "tombstone":  # one row per version here
                assert have is not None and have[0] == r["version"] and have[2] == values
                latest[key] = (have[0], False, ())
            else:
                assert r["version"] == (have[0] + 1 if have else 1), f"a version skipped {key}"
                latest[key] = (r["version"], bool(r["is_final"]), values)
        folded = apply_changelog(pd.concat(seen, ignore_index=True))
        assert sorted(zip(folded["user"], slots_of(folded), folded["version"], strict=True)) \
            == sorted((u, s, v) for (u, s), (v, _, vals) in latest.items() if vals)
    return {k: (v, f) for k, (v, f, _) in latest.items()}


def early_fold(pipe: Any, spec: GeneratorSpec, every: str | None = None) -> Any:
    """The running fold with early versions; tasks before it and after it fail once
    now and then (the ones after, once the step's rows were sent)."""
    before = fail_once(lambda b, p: b % 5 == 3 and p == 0)
    after = fail_once(lambda b, p: b % 4 == 2)
    return (pipe.generate(spec).map(parse, SCHEMA, name="parse")
            .transform(lambda df: df.mapInArrow(before, df.schema))
            .stateful(running, OUT, key="user", name="run").speculative(every=every)
            .transform(lambda df: df.mapInArrow(after, df.schema)))


def run_changelog(stream: Any, sink: ByBatch, ckpt: Path, lag_ms: int, restart_at: int
                  ) -> tuple[int, int]:
    """Write the changelog to ``sink`` until the sink is 100 slots past the lag;
    ``restart_at``: stopped once it is that many slots past t0 and started again from
    the checkpoint. (t0, the sink's last min time)."""

    def start() -> Any:
        return stream.foreach_batch(sink, checkpoint=str(ckpt), keep_tracking_columns=True,
                                    trigger="200 milliseconds")

    query = start()
    t0 = t0_of_checkpoint(ckpt, query)
    if restart_at:
        query.wait_for_min_time(GRID.slot_of(t0) + restart_at, timeout_s=180)
        query.stop()  # slots with versions shown stay in the state store
        query = start()
    query.wait_for_min_time(GRID.slot_of(t0 + lag_ms) + 100, timeout_s=180)
    assert not query.stuck()
    query.stop()
    return t0, query.min_time()


def check(sink: ByBatch, spec: GeneratorSpec, t0: int, final: int) -> None:
    assert not sink.rerun_differs, f"batches run again with other rows: {sink.rerun_differs}"
    frames = [sink.batches[b] for b in sorted(sink.batches)]
    latest = fold_batches(frames)
    rows = pd.concat(frames, ignore_index=True)
    ident = rows.assign(slot=slots_of(rows))[["user", "slot", "version", "op"]]
    assert not ident.duplicated().any(), "a version written twice"
    assert (rows["op"] == "tombstone").sum() > 0, "no early version was ever replaced"
    assert (~rows["is_final"]).sum() > 0, "no early version"
    exact = finals(rows)
    assert not {"slot_start", "op", "version", "is_final"} & set(exact.columns)
    got = exact.rename(columns={"lt_time": "slot"}).set_index(["user", "slot"])
    assert got.index.is_unique, "two finals of a (user, slot)"
    horizon = max(final, int(got.index.get_level_values("slot").max()) + 1)
    expected = batch_fold(all_input(spec, t0, horizon))
    done = expected[expected.index.get_level_values("slot") < final]
    assert len(done) >= 50
    assert set(done.index) <= set(got.index), "a complete slot without its final"
    assert all(latest[k][1] for k in done.index)
    assert set(got.index) <= set(expected.index)
    exp = expected.loc[got.index]
    assert (got["n"].to_numpy() == exp["n"].to_numpy()).all()
    assert (got["rows"].to_numpy() == exp["rows"].to_numpy()).all()
    pd.testing.assert_series_equal(got["total"], exp["total"], check_names=False)


def test_early_versions_then_finals_under_a_lagging_front_and_task_failures(
        spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=3, rate=150.0, payload_bytes=4, lag_ms={2: 1200})
    pipe = lowtide.Pipeline(spark, "specfold-lag", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = early_fold(pipe, spec)
    assert stream.segment_names() == ["parse", "run", "run.state", "sink"]
    sink = ByBatch()
    try:
        t0, final = run_changelog(stream, sink, tmp_path / "ckpt", 1200, 0)
    finally:
        pipe.close()
    check(sink, spec, t0, final)


def test_a_restart_neither_repeats_nor_skips_a_version(spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=2, rate=150.0, payload_bytes=4, lag_ms={1: 800})
    pipe = lowtide.Pipeline(spark, "specfold-restart", grid=GRID, stuck_after_ms=STUCK_MS)
    sink = ByBatch()
    try:
        t0, final = run_changelog(early_fold(pipe, spec, every="300 milliseconds"), sink,
                                  tmp_path / "ckpt", 800, restart_at=120)
    finally:
        pipe.close()
    check(sink, spec, t0, final)

