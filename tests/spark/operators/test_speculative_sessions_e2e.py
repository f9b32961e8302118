"""End to end, a speculative session window (``session_window(...).agg(...)
.speculative()``, rule 13): under a lagging front (whose late rows extend and merge
sessions already shown) and injected task failures before and after the step, across
a restart from the checkpoint, the changelog folded after every batch is what
``apply_changelog`` keeps (each tombstone cancels a live version it repeats, nothing
cancels a final), a batch run again writes the same rows, every row sits at or above
its session's end, and at the end the finals are exactly Spark's batch
``session_window`` over the whole input, with the columns of the window without
``speculative()``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import lowtide
from lowtide.spark.sinks.changelog import apply_changelog, finals
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once
from tests.spark.operators.changelogs import ByBatch, run_changelog
from tests.spark.operators.helpers import GRID, STUCK_MS, all_input
from tests.spark.operators.session_checks import (
    GAP,
    SCHEMA,
    check_sessions,
    slots_of,
    spark_sessions,
)

pytestmark = pytest.mark.spark
BOUNDS = ["session_window_start", "session_window_end"]
IDENT = ["user", *BOUNDS, "n", "total", "version"]  # what a tombstone repeats


def users(front: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Users "0" and "1" take turns every 16 rows of fronts 0 and 1 (a user's rows
    pause about 107 ms, longer than the gap: a session each burst); the lagging front
    2's rows, 8 rows later, are every other 64 rows a burst of the same users, late,
    bridging two sessions already shown (a merge), else user "2"."""
    bridge = np.where((seq >> 6) & 1 == 0, ((seq + 8) >> 4) & 1, 2)
    return np.where(front == 2, bridge, (seq >> 4) & 1).astype(str)


def merging(b: pa.RecordBatch) -> pa.RecordBatch:
    front, seq = b["front"].to_numpy(), b["seq"].to_numpy()
    return pa.record_batch({"front": b["front"], "seq": b["seq"],
                            "user": pa.array(users(front, seq)),
                            "amount": pa.array((seq & 63).astype(np.float64))})


def live_versions(frames: list[pd.DataFrame]) -> tuple[pd.DataFrame, int]:
    """Fold the batches as a reader would, checking each (a tombstone cancels a live
    version it repeats, never a final); after each batch the live versions are what
    :func:`apply_changelog` keeps of the rows so far. (The live versions, how many
    tombstones cancelled a session that did not go on in the same batch: a merge.)"""
    live: list[tuple[Any, ...]] = []
    seen: list[pd.DataFrame] = []
    merged = 0
    for rows in frames:
        if not len(rows):
            continue
        seen.append(rows)
        assert (rows["lt_time"].to_numpy() >= slots_of(rows["session_window_end"])).all(), \
            "a row below its session's end"
        inserts = set(zip(rows["user"], rows["session_window_start"], rows["version"],
                          strict=True))
        for r in rows.sort_values(["op"], ascending=False, kind="stable").to_dict("records"):
            ident = tuple(r[c] for c in IDENT)
            if r["op"] == "tombstone":
                match = [x for x in live if x[:-1] == ident]
                assert match, f"a tombstone of no live version: {ident}"
                assert not match[0][-1], f"a final cancelled: {ident}"
                live.remove(match[0])
                merged += (r["user"], r["session_window_start"], r["version"] + 1) \
                    not in inserts
            else:
                live.append((*ident, bool(r["is_final"])))
        folded = apply_changelog(pd.concat(seen, ignore_index=True))
        assert sorted(map(tuple, folded[[*IDENT, "is_final"]].itertuples(index=False))) \
            == sorted(live)
    return pd.DataFrame(live, columns=[*IDENT, "is_final"]), merged


@pytest.mark.slow  # ~15 s; the changelog of sessions by default: test_speculative_sessions.py
def test_early_sessions_then_finals_under_a_lagging_front_failures_and_a_restart(
        spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=3, rate=150.0, payload_bytes=4, lag_ms={2: 1200})
    pipe = lowtide.Pipeline(spark, "specsess", grid=GRID, stuck_after_ms=STUCK_MS)
    before = fail_once(lambda b, p: b % 5 == 3 and p == 0)
    after = fail_once(lambda b, p: b % 4 == 2)
    stream = (pipe.generate(spec).map(merging, SCHEMA, name="parse")
              .transform(lambda df: df.mapInArrow(before, df.schema))
              .session_window(GAP, key="user", name="sessions")
              .agg(n="count", total=("amount", "sum")).speculative()
              .transform(lambda df: df.mapInArrow(after, df.schema)))
    assert stream.segment_names() == ["parse", "sessions", "sessions.state", "sink"]
    sink = ByBatch(("user", "session_window_start", "version", "op"))
    try:
        t0, final = run_changelog(stream, sink, tmp_path / "ckpt", 1200, restart_at=120,
                                  past=300, operators=1)
    finally:
        pipe.close()
    assert not sink.rerun_differs, f"batches run again with other rows: {sink.rerun_differs}"
    frames = [sink.batches[b] for b in sorted(sink.batches)]
    live, merged = live_versions(frames)
    rows = pd.concat(frames, ignore_index=True)
    assert (~rows["is_final"]).sum() > 0 and merged > 0, "no early version, or no merge"
    pending = live[~live["is_final"]]
    assert (slots_of(pending["session_window_end"]) >= final).all(), \
        "a session below the sink's min time is not final"
    exact = finals(rows)
    assert list(exact.columns[:5]) == ["user", *BOUNDS, "n", "total"]  # as without it
    got = exact.assign(start=slots_of(exact["session_window_start"]),
                       end=slots_of(exact["session_window_end"]))
    assert (got["lt_time"] == got["end"]).all(), "a final not at its session's end"
    horizon = max(final, int(got["end"].max()) + 1)
    rows = all_input(spec, t0, horizon)
    rows = rows.assign(user=users(rows["front"].to_numpy(), rows["seq"].to_numpy()))
    check_sessions(got[["user", "start", "end", "n", "total"]],
                   spark_sessions(spark, rows, GAP), final, least=8)
