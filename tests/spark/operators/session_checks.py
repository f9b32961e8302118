"""What the session windows' end-to-end tests share: users in bursts, Spark's own batch
``session_window`` over the generator's rows and the check of a query's sessions
against it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tests.spark.operators.helpers import GRID

SCHEMA = "front int, seq long, user string, amount double"
GAP = "100 milliseconds"
GAP_MS = 100
#: how far past the first batch the sink must get: a user's sessions start about 1.3 s
#: apart, so 7 s hold over 20 sessions of 4 users (a warm session got 2.5 s in 2.5 s)
SLOTS = 700


def bursts(b: pa.RecordBatch) -> pa.RecordBatch:
    """Users in bursts: 16 rows of a front's one user, then 48 of the others (a user's
    rows pause about 300 ms, longer than the gap)."""
    seq = b["seq"]
    user = pc.cast(pc.bit_wise_and(pc.shift_right(seq, 4), 3), pa.string())
    return pa.record_batch({"front": b["front"], "seq": seq, "user": user,
                            "amount": pc.cast(pc.bit_wise_and(seq, 63), pa.float64())})


def users_of(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.assign(user=((rows["seq"].to_numpy() >> 4) & 3).astype(str))


def spark_sessions(spark: Any, rows: pd.DataFrame, gap: Any) -> pd.DataFrame:
    """Spark's batch ``session_window`` over ``rows`` at their slots' times:
    (user, start slot, end slot) -> n, total."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(rows[["user", "front", "slot", "amount"]])
    df = df.withColumn("ts", F.timestamp_millis(F.col("slot") * GRID.delta_ms))
    out = (df.groupBy("user", F.session_window("ts", gap))
           .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
           .select("user", (F.unix_millis("session_window.start") / GRID.delta_ms)
                   .cast("long").alias("start"),
                   (F.unix_millis("session_window.end") / GRID.delta_ms).cast("long")
                   .alias("end"), "n", "total"))
    return out.toPandas().set_index(["user", "start", "end"]).sort_index()


def check_sessions(got: pd.DataFrame, expected: pd.DataFrame, final: int, least: int = 20
                   ) -> None:
    """``got`` (user, start, end, n, total): none twice, each equal to Spark's batch
    session, and every batch session final below ``final`` (at least ``least``) there."""
    got = got.set_index(["user", "start", "end"]).sort_index()
    assert got.index.is_unique, "a session emitted twice"
    assert set(got.index) <= set(expected.index), "a session the batch does not have"
    exp = expected.loc[got.index]
    assert (got["n"].to_numpy() == exp["n"].to_numpy()).all()
    np.testing.assert_allclose(got["total"].to_numpy(float), exp["total"].to_numpy(float))
    done = expected[expected.index.get_level_values("end") < final]
    assert len(done) >= least
    assert set(done.index) <= set(got.index), "a final session not emitted"


def slots_of(ts: pd.Series) -> np.ndarray:
    return pd.to_datetime(ts, utc=True).map(lambda t: t.value // 1_000_000).to_numpy() \
        // GRID.delta_ms
