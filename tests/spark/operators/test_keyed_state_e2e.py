"""End to end, a user's own keyed state (``stream.stateful``): a running count and sum
per user, one output row per (user, slot), equals a batch fold of the same events in
slot order, under a lagging front and injected task failures before and after the
step, also across a restart from the checkpoint; every (user, slot) below the sink's
announced min time is there (its pending rows held the min time until the step ran)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import lowtide
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once
from tests.spark.operators.folds import batch_fold, running
from tests.spark.operators.helpers import GRID, SCHEMA, STUCK_MS, all_input, parse, run_timed

pytestmark = pytest.mark.spark


def test_the_store_schemas_are_the_ones_running_queries_keep(spark) -> None:
    """Typed (no JVM round trip per schema in each task), and equal to the DDL the
    state of earlier versions' checkpoints was written with."""
    from pyspark.sql.types import _parse_datatype_string

    from lowtide.spark.operators import state_processor as sp

    for typed, ddl in ((sp.RECORD_SCHEMA, "parent long, wakes array<long>, timer_ms long, "
                                          "key binary, data binary"),
                       (sp.PART_KEY_SCHEMA, "tag long, part int"),
                       (sp.PART_SCHEMA, "rows binary")):
        assert not isinstance(typed, str) and typed == _parse_datatype_string(ddl)



# ~12 s each: "running" in the slow tier ("restarted" runs the same query, then restarts it)
@pytest.mark.parametrize("restart", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["running", "restarted"])
def test_running_state_with_lag_and_failures_equals_batch(spark, tmp_path: Path,
                                                          restart: bool) -> None:
    """Restarted: the query stops once the sink is 100 slots in and starts again from
    its checkpoint; the users' running states (and their pending rows) come back from
    the state store, so the fold goes on as if it had never stopped."""
    spec = GeneratorSpec(fronts=3, rate=150.0, payload_bytes=4, lag_ms={2: 1200})
    pipe = lowtide.Pipeline(spark, f"keyed-{restart}", grid=GRID, stuck_after_ms=STUCK_MS)
    before = fail_once(lambda b, p: b % 5 == 3 and p == 0)
    after = fail_once(lambda b, p: b % 4 == 2)
    stream = (pipe.generate(spec)
              .map(parse, SCHEMA, name="parse")
              .transform(lambda df: df.mapInArrow(before, df.schema))
              .stateful(running, "n long, total double, rows long", key="user", name="run")
              .transform(lambda df: df.mapInArrow(after, df.schema)))
    assert stream.segment_names() == ["parse", "run", "run.state", "sink"]
    results, t0, final = run_timed(pipe, stream, tmp_path, 250, 100 if restart else 0)
    got = results.rename(columns={"lt_time": "slot"}).set_index(["user", "slot"])
    assert got.index.is_unique, "a (user, slot) emitted twice"
    horizon = max(final, int(got.index.get_level_values("slot").max()) + 1)
    expected = batch_fold(all_input(spec, t0, horizon))
    done = expected[expected.index.get_level_values("slot") < final]
    assert len(done) >= 100
    # complete: every (user, slot) below the announced min time was emitted
    assert set(done.index) <= set(got.index)
    # exact: each output equals the batch fold (so no row came after its slot ran)
    assert set(got.index) <= set(expected.index)
    exp = expected.loc[got.index]
    assert (got["n"].to_numpy() == exp["n"].to_numpy()).all()
    assert (got["rows"].to_numpy() == exp["rows"].to_numpy()).all()
    pd.testing.assert_series_equal(got["total"], exp["total"], check_names=False)


def counting(key: tuple[Any, ...], rows: pd.DataFrame, state: Any) -> tuple[Any, pd.DataFrame]:
    n = (state or 0) + len(rows)
    return n, pd.DataFrame({"n": [n]})


def test_a_nullable_long_key_releases_its_holds(spark, tmp_path: Path) -> None:
    """Spark hands a long key as 3 or 3.0 (a batch with a null key among its rows), and
    a null key as None or nan: the holds a key opened are released all the same, so the
    sink's min time moves on (it stalled, "acks disagree" in the state segment, when
    each hold was recomputed from the key object at its release). And each key's
    outputs are its own fold: grouped by a null long key, PySpark 4.2 mixed another
    key's rows into the null key's state; lowtide groups by the key's JSON instead."""
    from pyspark.sql import functions as F

    spec = GeneratorSpec(fronts=2, rate=150.0, payload_bytes=4)
    pipe = lowtide.Pipeline(spark, "keyed-null", grid=GRID, stuck_after_ms=STUCK_MS)
    k = F.when(F.col("seq") % 4 == 0, F.lit(None)).otherwise(F.col("seq") % 3)
    stream = (pipe.generate(spec)
              .select(k.cast("long").alias("k"), "seq", name="keys")
              .stateful(counting, "n long", key="k", name="count"))
    results, t0, _ = run_timed(pipe, stream, tmp_path, 150)  # raises if it stalls
    rows = all_input(spec, t0, int(results["lt_time"].max()) + 1)
    rows["k"] = np.where(rows["seq"] % 4 == 0, -1, rows["seq"] % 3)  # -1: the null key
    per_slot = rows.groupby(["k", "slot"]).size().groupby("k").cumsum()
    got = results.assign(k=results["k"].fillna(-1).astype(int))
    expected = per_slot.loc[list(zip(got["k"], got["lt_time"], strict=True))].to_numpy()
    # every key's outputs are its own running count: no key's rows in another's state
    assert set(got["k"]) == {-1, 0, 1, 2} and (got["n"].to_numpy() == expected).all()


def test_stateful_key_errors_name_the_step(spark, tmp_path: Path) -> None:
    pipe = lowtide.Pipeline(spark, "keyed-err", grid=GRID)
    stream = (pipe.generate(fronts=1).map(parse, SCHEMA, name="parse")
              .stateful(running, "n long", key="nobody", name="run"))
    try:
        with pytest.raises(ValueError, match=r"^stateful 'run': no key column 'nobody' "):
            stream.to_null(checkpoint=str(tmp_path / "ckpt"))
        with pytest.raises(ValueError, match=r"^stateful '\w+' key \[\]"):
            stream.stateful(running, "n long", key=[])
    finally:
        pipe.close()
