"""``lowtide bench spark --shape speculative``'s figures without Spark: a changelog of
two versions and a final per window, arriving at known times, against the batch."""

from __future__ import annotations

import pandas as pd

from lowtide.bench.spark.speculative import WINDOW_MS, batch_windows, speculative_figures

T0 = 1_700_000_000_000  # the generator's t0, on a window boundary


def changelog(batch: pd.DataFrame) -> pd.DataFrame:
    """Each window: v1 (n - 1) 200 ms before its end, v2 (n) 300 ms after, its final
    6,000 ms after."""
    rows = []
    for (user, end), r in batch.iterrows():
        base = {"user": user, "end_ms": end, "total": r["total"],
                "window_start": pd.Timestamp(end - WINDOW_MS, unit="ms", tz="UTC"),
                "window_end": pd.Timestamp(end, unit="ms", tz="UTC")}
        rows += [{**base, "n": r["n"] - 1, "op": "insert", "version": 1, "is_final": False,
                  "arrived_ms": end - 200},
                 {**base, "n": r["n"] - 1, "op": "tombstone", "version": 1,
                  "is_final": False, "arrived_ms": end + 300},
                 {**base, "n": r["n"], "op": "insert", "version": 2, "is_final": False,
                  "arrived_ms": end + 300},
                 {**base, "n": r["n"], "op": "tombstone", "version": 2, "is_final": False,
                  "arrived_ms": end + 6000},
                 {**base, "n": r["n"], "op": "insert", "version": 3, "is_final": True,
                  "arrived_ms": end + 6000}]
    return pd.DataFrame(rows)


def test_first_result_final_and_the_checks() -> None:
    complete = T0 + 5 * WINDOW_MS
    batch = batch_windows(T0, complete)
    run = {"rows": changelog(batch), "t0": T0, "complete_ms": complete, "from_ms": T0}
    fig = speculative_figures(run)
    assert (fig["first_result_p50_ms"], fig["final_p50_ms"]) == (300.0, 6000.0)
    assert fig["tombstones"] == 2 * len(batch) and fig["windows"] == len(batch)
    assert fig["changelog_equals_final"] and fig["matches_batch"]
    wrong = run["rows"].copy()
    wrong.loc[wrong["is_final"], "n"] += 1
    assert not speculative_figures({**run, "rows": wrong})["matches_batch"]
