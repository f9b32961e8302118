"""End to end, a retry loop (rule 11) before exact windows: a step fails some rows the
first one or two times and some always, under a lagging front, injected task failures
and a restart from the checkpoint while rows wait in the loop. The windows equal a
batch recomputation over every row not given up (so none was emitted while one of its
rows was still going round), and every row given up is in the dead-letter output
exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once, t0_of_checkpoint
from tests.spark.operators.helpers import (
    AGG_COLS,
    GRID,
    SCHEMA,
    STUCK_MS,
    all_input,
    batch_windows,
    check,
    parse,
    read_results,
    start_slots,
)

pytestmark = pytest.mark.spark


def tries_needed(seq: np.ndarray, front: np.ndarray) -> np.ndarray:
    """Attempts a row needs to succeed: 2 for seq % 7 == 3, 3 for seq % 11 == 5, and
    never (99) for front 0's seq % 13 == 0."""
    need = np.ones(len(seq), np.int64)
    need[seq % 7 == 3] = 2
    need[seq % 11 == 5] = 3
    need[(seq % 13 == 0) & (front == 0)] = 99
    return need


def flaky(b: pa.RecordBatch) -> pa.RecordBatch:
    """Fails a row while its attempt (``lt_attempt``, 0 first) is below what it needs."""
    seq, front = b["seq"].to_numpy(), b["front"].to_numpy()
    failed = b["lt_attempt"].to_numpy() + 1 < tries_needed(seq, front)
    error = pa.array(np.where(failed, "service down", None).tolist(), pa.string())
    return pa.record_batch({"front": b["front"], "seq": b["seq"], "user": b["user"],
                            "amount": b["amount"], "error": error})


def given_up(rows: pd.DataFrame, attempts: int) -> pd.Series:
    return pd.Series(tries_needed(rows["seq"].to_numpy(), rows["front"].to_numpy())
                     > attempts, index=rows.index)


def run_loop(pipe: Any, stream: Any, tmp: Path, policy: lowtide.RetryPolicy, spec: GeneratorSpec,
             restart: bool) -> tuple[pd.DataFrame, int, int]:
    """Run until the sink is complete 4 s past the first window, restarting from the
    checkpoint once (the loop holding rows) if asked; (results, t0, final min time).
    Each attempt of a row costs a micro-batch: on a loaded machine the timeouts are
    long."""
    out, ckpt = tmp / "out", tmp / "ckpt"

    def start() -> Any:
        return stream.write_parquet(str(out), checkpoint=str(ckpt), trigger="200 milliseconds")

    query = start()
    try:
        t0 = t0_of_checkpoint(ckpt, query)
        first_end = GRID.slot_of(t0) // 100 * 100 + 200
        if restart:
            query.wait_for_min_time(first_end, timeout_s=300)
            query.stop()
            assert policy.status().waiting_rows > 0  # stopped with rows in the loop
            query = start()
        query.wait_for_min_time(max(first_end, query.min_time()) + 400, timeout_s=300)
        assert not query.stuck()
        query.stop()
        final = query.min_time()
    finally:
        query.stop()
        pipe.close()
    return read_results(out), t0, final


def check_against_batch(results: pd.DataFrame, spec: GeneratorSpec, t0: int, final: int,
                        policy: lowtide.RetryPolicy) -> None:
    horizon = max(final, int(start_slots(results).max()) + 100)
    rows = all_input(spec, t0, horizon)
    dropped = given_up(rows, policy.attempts)
    check(results, batch_windows(rows[~dropped], 100, 100), horizon, 100, AGG_COLS)
    expected = batch_windows(rows[~dropped & (rows["slot"] < final)], 100, 100)
    done = expected[expected["start"] + 100 <= final]
    got = set(zip(results["user"], start_slots(results), strict=True))
    assert len(done) >= 8 and all(k in got for k in zip(done["user"], done["start"],
                                                         strict=True))
    # the rows given up, below the final min time: each in the dead letters once
    dead = pq.read_table(policy.dead_letter_path).to_pandas()
    keys = list(zip(dead["front"], dead["seq"], strict=True))
    assert len(keys) == len(set(keys)), "a dead letter twice"
    want = rows[dropped & (rows["slot"] < final)]
    assert set(zip(want["front"], want["seq"], strict=True)) <= set(keys)
    assert len(want) >= 5 and (dead["lt_attempt"] == policy.attempts).all()
    assert (dead["error"] == "service down").all()
    slot_of = dict(zip(zip(rows["front"], rows["seq"], strict=True), rows["slot"], strict=True))
    assert all(slot_of[k] == t for k, t in zip(keys, dead["lt_time"], strict=True) if k in slot_of)


def describe(pipe: Any, spec: GeneratorSpec, policy: lowtide.RetryPolicy,
             failures: bool) -> Any:
    stream = (pipe.generate(spec).map(parse, SCHEMA, name="parse")
              .map(flaky, SCHEMA, name="score", retry=policy))
    if failures:  # in the retry step's task, after its batch went to the tracker
        after = fail_once(lambda b, p: b % 4 == 2)
        stream = stream.transform(lambda df: df.mapInArrow(after, df.schema))
    return (stream.window("1 second", key="user", name="win")
            .agg(n="count", total=("amount", "sum"), lo=("amount", "min"),
                 hi=("amount", "max"), avg=("amount", "mean")))


@pytest.mark.slow  # ~17 s; a retry loop under a task failure by default: test_chaos_retry.py
def test_a_retry_loop_with_a_lagging_front_and_task_failures_equals_batch(
        spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4, lag_ms={1: 800})
    policy = lowtide.RetryPolicy(attempts=3, path=str(tmp_path / "retries"))
    pipe = lowtide.Pipeline(spark, "retry-lag", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = describe(pipe, spec, policy, failures=True)
    assert stream.segment_names() == ["parse", "score.retry", "score", "win", "win.state",
                                      "sink"]
    results, t0, final = run_loop(pipe, stream, tmp_path, policy, spec, restart=False)
    check_against_batch(results, spec, t0, final, policy)


@pytest.mark.slow  # ~16 s; a retry loop restarted by default: tests/bench/test_chaos_retry.py
def test_a_restart_from_the_checkpoint_mid_loop_loses_and_repeats_no_retry(
        spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4, lag_ms={1: 500})
    policy = lowtide.RetryPolicy(attempts=2, path=str(tmp_path / "retries"))
    pipe = lowtide.Pipeline(spark, "retry-restart", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = describe(pipe, spec, policy, failures=True)
    results, t0, final = run_loop(pipe, stream, tmp_path, policy, spec, restart=True)
    check_against_batch(results, spec, t0, final, policy)
