"""What the stateful operators' end-to-end tests share (the pipeline tests too): the
generator's rows parsed into users and amounts, every row the generator labels (it is
deterministic), the batch recomputation of exact windows and the check against it,
running a stream until its sink's min time, and the one-line errors at start."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.core.time import TimeGrid
from lowtide.spark.operators.window_state import window_starts
from lowtide.spark.sources.generator import GeneratorSpec, label_ms, rows_before
from tests.spark.helpers import t0_of_checkpoint

GRID = TimeGrid(delta_ms=10)
#: a micro-batch here can take several seconds (Python workers start after a restart,
#: retried tasks): "stuck" must mean stuck, not a slow batch between emission and sink
STUCK_MS = 60_000
#: the columns of parse()
SCHEMA = "front int, seq long, user string, amount double"


def parse(b: pa.RecordBatch) -> pa.RecordBatch:
    seq = b["seq"]
    user = pc.cast(pc.bit_wise_and(pc.add(seq, pc.cast(b["front"], pa.int64())), 3), pa.string())
    return pa.record_batch({"front": b["front"], "seq": seq, "user": user,
                            "amount": pc.cast(pc.bit_wise_and(seq, 63), pa.float64())})


def all_input(spec: GeneratorSpec, t0: int, horizon: int,
              drop_front0: bool = False) -> pd.DataFrame:
    """Every row the generator labels with a slot < ``horizon`` (it is deterministic)."""
    parts = []
    for f in spec.front_ids():
        if drop_front0 and f == 0:
            continue
        n = rows_before(t0, spec.rate_of(f), horizon * GRID.delta_ms - 1)
        seq = np.arange(n, dtype=np.int64)
        ms = label_ms(t0, spec.rate_of(f), seq)
        parts.append(pd.DataFrame({"front": f, "seq": seq, "slot": ms // GRID.delta_ms,
                                   "user": ((seq + f) & 3).astype(str),
                                   "amount": (seq & 63).astype(np.float64)}))
    return pd.concat(parts, ignore_index=True)


def batch_windows(rows: pd.DataFrame, size: int, slide: int) -> pd.DataFrame:
    """The batch recomputation: every (user, window) over the whole input."""
    starts = window_starts(rows["slot"].to_numpy(), size, slide)
    exploded = pd.concat([rows.assign(start=starts[:, j]) for j in range(starts.shape[1])])
    g = exploded.groupby(["user", "start"])
    out = g.agg(n=("amount", "size"), total=("amount", "sum"), lo=("amount", "min"),
                hi=("amount", "max"), avg=("amount", "mean"),
                fronts=("front", "nunique")).reset_index()
    out["span"] = out["hi"] - out["lo"]
    return out


def read_results(out: Path) -> pd.DataFrame:
    files = sorted(glob.glob(str(out / "*.parquet")))
    return pa.concat_tables([pq.read_table(f) for f in files]).to_pandas()


def start_slots(df: pd.DataFrame) -> pd.Series:
    ms = pd.to_datetime(df["window_start"], utc=True).map(lambda t: t.value // 1_000_000)
    return ms // GRID.delta_ms


def check(results: pd.DataFrame, expected: pd.DataFrame, horizon: int, size: int,
          cols: list[str]) -> None:
    """``expected``: the batch recomputation over every row with slot < ``horizon``;
    every window ending at or below the sink's final min time must be there."""
    results = results.assign(start=start_slots(results))
    keys = list(zip(results["user"], results["start"], strict=True))
    assert len(keys) == len(set(keys)), "a window was emitted twice"
    exp = expected[expected["start"] + size <= horizon].set_index(["user", "start"])
    got = results.set_index(["user", "start"]).sort_index()
    assert set(got.index) <= set(exp.index), "a window the batch does not have"
    # emitted windows hold exactly the rows of the whole input: none came later
    exp_got = exp.loc[got.index]
    for c in cols:
        np.testing.assert_allclose(got[c].to_numpy(np.float64),
                                   exp_got[c].to_numpy(np.float64), err_msg=c)


AGG_COLS = ["n", "total", "lo", "hi", "avg"]


def run_timed(pipe: Any, stream: Any, tmp: Path, slots: int, restart_at: int = 0,
              more: int = 0) -> tuple[pd.DataFrame, int, int]:
    """Write ``stream`` with its rows' slots (``lt_time``) until the sink's min time is
    ``slots`` past the first batch's t0 (stopped and restarted from the checkpoint
    once it is ``restart_at`` past, if given), then ``more`` past where it is then;
    (results, t0, the sink's final min time)."""
    out, ckpt = tmp / "out", tmp / "ckpt"

    def start() -> Any:
        return stream.write_parquet(str(out), checkpoint=str(ckpt), keep_tracking_columns=True,
                                    trigger="200 milliseconds")

    try:
        query = start()
        t0 = t0_of_checkpoint(ckpt, query)
        if restart_at:
            query.wait_for_min_time(GRID.slot_of(t0) + restart_at, timeout_s=120)
            query.stop()  # slots with pending rows stay in the state store, held
            query = start()
        query.wait_for_min_time(GRID.slot_of(t0) + slots, timeout_s=120)
        if more:
            query.wait_for_min_time(query.min_time() + more, timeout_s=120)
        assert not query.stuck()
        query.stop()
        final = query.min_time()
    finally:
        pipe.close()
    return read_results(out), t0, final


def start_fails(spark: Any, tmp_path: Path, describe: Any) -> str:
    """The one-line error describing a pipeline raises when its query starts."""
    pipe = lowtide.Pipeline(spark, "bad", grid=GRID)
    try:
        with pytest.raises(ValueError) as err:
            describe(pipe.generate(fronts=1, rate=10.0)).to_null(
                checkpoint=str(tmp_path / "ckpt"))
    finally:
        pipe.close()
    message = str(err.value)
    assert "\n" not in message
    return message


EVERY = 10  # slots


def batch_running(rows: pd.DataFrame) -> pd.DataFrame:
    """(user, as_of slot) -> n, total: per range with rows of the user, its rows below
    the range's end."""
    per = rows.assign(end=rows["slot"] - rows["slot"] % EVERY + EVERY).groupby(
        ["user", "end"]).agg(rows=("amount", "size"), amount=("amount", "sum")).reset_index()
    per = per.sort_values(["user", "end"])
    per["n"] = per.groupby("user")["rows"].cumsum()
    per["total"] = per.groupby("user")["amount"].cumsum()
    return per.set_index(["user", "end"])
