"""End to end, a speculative fold (``stateful(...).speculative()``, rule 13): under a
lagging front and injected task failures before and after the step, across a restart
from the checkpoint, the changelog folded after every batch is the latest version of
each (user, slot) (tombstones cancel the version they name, versions rise, nothing
follows a final), every row sits at its slot, a batch run again writes the same rows,
and at the end the finals are exactly the batch fold of the whole input (what the
same ``stateful`` without ``speculative()`` emits, test_keyed_state_e2e)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import lowtide
from lowtide.spark.sinks.changelog import finals
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once
from tests.spark.operators.changelogs import ByBatch, fold_batches, run_changelog
from tests.spark.operators.folds import batch_fold, running
from tests.spark.operators.helpers import GRID, SCHEMA, STUCK_MS, all_input, parse

pytestmark = pytest.mark.spark
OUT = "n long, total double, rows long"
ORDER = ("user", "slot_start", "version", "op")  # a batch's rows, as ByBatch keeps them


def slots_of(rows: pd.DataFrame) -> pd.Series:
    ms = pd.to_datetime(rows["slot_start"], utc=True).map(lambda t: t.value // 1_000_000)
    return ms // GRID.delta_ms


def early_fold(pipe: Any, spec: GeneratorSpec, every: str | None = None) -> Any:
    """The running fold with early versions; tasks before it and after it fail once
    now and then (the ones after, once the step's rows were sent)."""
    before = fail_once(lambda b, p: b % 5 == 3 and p == 0)
    after = fail_once(lambda b, p: b % 4 == 2)
    return (pipe.generate(spec).map(parse, SCHEMA, name="parse")
            .transform(lambda df: df.mapInArrow(before, df.schema))
            .stateful(running, OUT, key="user", name="run").speculative(every=every)
            .transform(lambda df: df.mapInArrow(after, df.schema)))


def check(sink: ByBatch, spec: GeneratorSpec, t0: int, final: int) -> None:
    assert not sink.rerun_differs, f"batches run again with other rows: {sink.rerun_differs}"
    frames = [sink.batches[b] for b in sorted(sink.batches)]
    latest = fold_batches(frames, slots_of, 0, ["n", "total", "rows"])
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


@pytest.mark.slow  # ~14 s; the changelog of a fold by default: test_speculative_fold.py
def test_early_versions_then_finals_under_a_lagging_front_and_task_failures(
        spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=3, rate=150.0, payload_bytes=4, lag_ms={2: 1200})
    pipe = lowtide.Pipeline(spark, "specfold-lag", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = early_fold(pipe, spec)
    assert stream.segment_names() == ["parse", "run", "run.state", "sink"]
    sink = ByBatch(ORDER)
    try:
        t0, final = run_changelog(stream, sink, tmp_path / "ckpt", 1200, past=100)
    finally:
        pipe.close()
    check(sink, spec, t0, final)


@pytest.mark.slow  # ~25 s; a speculative restart by default: test_speculative_e2e.py
def test_a_restart_neither_repeats_nor_skips_a_version(spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=2, rate=150.0, payload_bytes=4, lag_ms={1: 800})
    pipe = lowtide.Pipeline(spark, "specfold-restart", grid=GRID, stuck_after_ms=STUCK_MS)
    sink = ByBatch(ORDER)
    try:
        t0, final = run_changelog(early_fold(pipe, spec, every="300 milliseconds"), sink,
                                  tmp_path / "ckpt", 800, restart_at=120, past=100,
                                  operators=1)
    finally:
        pipe.close()
    check(sink, spec, t0, final)

