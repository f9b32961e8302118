"""The changelog tests' helpers (speculative windows and folds, rule 13): a
``foreach_batch`` sink that keeps each batch by id, a reader's fold of the batches
that checks them, a run under a lagging front with a restart, and the check of a
1-second window's changelog against a batch recomputation."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pandas as pd

from lowtide.spark.sinks.changelog import apply_changelog, finals
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import t0_of_checkpoint
from tests.spark.operators.helpers import (
    AGG_COLS,
    GRID,
    all_input,
    batch_windows,
    check,
    start_slots,
)

WINDOW_SLOTS = 100  # check_changelog's windows: 1 second


class ByBatch:
    """A ``foreach_batch`` function that keeps each batch's rows by batch id, as an
    idempotent sink does, and records any batch run again with other rows (each
    batch's rows in the order of ``cols``, its changelog's identity)."""

    def __init__(self, cols: tuple[str, ...] = ("user", "window_start", "version", "op")
                 ) -> None:
        self.cols = list(cols)
        self.batches: dict[int, pd.DataFrame] = {}
        self.rerun_differs: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.toPandas().sort_values(self.cols).reset_index(drop=True)
        with self._lock:
            before = self.batches.get(batch_id)
            if before is not None and not before.equals(rows):
                self.rerun_differs.append(batch_id)
            self.batches[batch_id] = rows


def fold_batches(frames: list[pd.DataFrame], slot_of: Any, at: int, cols: list[str]
                 ) -> dict[tuple[str, int], tuple[int, bool]]:
    """Fold the changelog batch by batch as a reader would, checking it (each row at
    ``at`` past the slot ``slot_of`` gives it, one row per version); after each batch,
    :func:`apply_changelog` on the rows so far keeps exactly the latest version of
    each. Returns (user, slot) -> (latest version, is final)."""
    latest: dict[tuple[str, int], tuple[int, bool, tuple[Any, ...]]] = {}
    seen: list[pd.DataFrame] = []
    for rows in frames:
        if not len(rows):
            continue
        seen.append(rows)
        rows = rows.assign(start=slot_of(rows))
        assert (rows["lt_time"] == rows["start"] + at).all(), "not at the hold's slot"
        # a version's insert, its tombstone, the next version
        for r in rows.sort_values(["version", "op"]).to_dict("records"):
            key, values = (r["user"], r["start"]), tuple(r[c] for c in cols)
            have = latest.get(key)
            assert have is None or not have[1], f"a version after the final: {key}"
            if r["op"] == "tombstone":
                assert have is not None and have[0] == r["version"] and have[2] == values
                latest[key] = (have[0], False, ())  # cancelled: the next insert follows
            else:
                assert r["version"] == (have[0] + 1 if have else 1), f"a version skipped {key}"
                latest[key] = (r["version"], bool(r["is_final"]), values)
        folded = apply_changelog(pd.concat(seen, ignore_index=True))
        assert sorted(zip(folded["user"], slot_of(folded), folded["version"], strict=True)) \
            == sorted((u, s, v) for (u, s), (v, _, vals) in latest.items() if vals)
    return {k: (v, f) for k, (v, f, _) in latest.items()}


def state_operators(query: Any) -> list[str]:
    """The stateful operators of a query's last micro-batch."""
    progress = query.query.lastProgress
    return [op["operatorName"] for op in progress["stateOperators"]]


def run_changelog(stream: Any, sink: Any, ckpt: Path, lag_ms: int, restart_at: int = 0,
                  past: int = 300, operators: int = 2) -> tuple[int, int]:
    """Write ``stream``'s changelog to ``sink`` (``foreach_batch``) until the sink is
    ``past`` slots past the lag (three 1-second windows); ``restart_at``: stopped once the sink
    is that many slots past t0 (with ``operators`` state operators: Spark's aggregation
    and the changelog's step) and started again from the checkpoint. (t0, the sink's
    last min time)."""

    def start() -> Any:
        return stream.foreach_batch(sink, checkpoint=str(ckpt), keep_tracking_columns=True,
                                    trigger="200 milliseconds")

    query = start()
    t0 = t0_of_checkpoint(ckpt, query)
    if restart_at:
        query.wait_for_min_time(GRID.slot_of(t0) + restart_at, timeout_s=300)
        assert len(state_operators(query)) == operators, state_operators(query)
        query.stop()  # windows with versions shown stay in both state stores
        query = start()
    query.wait_for_min_time(GRID.slot_of(t0 + lag_ms) + past, timeout_s=300)
    assert not query.stuck()
    query.stop()
    return t0, query.min_time()


def check_changelog(frames: list[pd.DataFrame], spec: GeneratorSpec, t0: int, final: int
                    ) -> dict[tuple[str, int], tuple[int, bool]]:
    """The changelog's batches fold (:func:`fold_batches`) with a final for every
    window complete at ``final``, some version replaced, and finals equal to a batch
    recomputation; the fold."""
    latest = fold_batches(frames, start_slots, WINDOW_SLOTS - 1, AGG_COLS)
    rows = pd.concat(frames, ignore_index=True)
    assert (rows["op"] == "tombstone").sum() > 0, "no early version was ever replaced"
    done = {k for k in latest if k[1] + WINDOW_SLOTS <= final}
    assert done and all(latest[k][1] for k in done), "a complete window without its final"
    exact = finals(rows)
    horizon = max(final, int(start_slots(exact).max()) + WINDOW_SLOTS)
    size = WINDOW_SLOTS  # tumbling
    check(exact, batch_windows(all_input(spec, t0, horizon), size, size), horizon, size,
          AGG_COLS)
    assert len(exact) == sum(f for _, f in latest.values())
    return latest
