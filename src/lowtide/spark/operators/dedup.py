"""Exact ``dropDuplicates`` over global time, on the keyed state runtime.

::

    first = events.dropDuplicates(["user", "ad"], within="10 minutes")

A row is dropped when a row with the same values in ``subset`` (all columns when it is
None; null equal to null, as in ``dropDuplicates``) was kept at most ``within`` before
it in global time (``within=None``: ever before); rows are taken in global time order,
rows of one slot by ack id (a fixed order, the same in every attempt). So the first row
of a key is kept, the rows within ``within`` after it are dropped, and the first row
after that is kept again. Exact: a row is decided only once the step's inbound segment
is complete below its slot (a hold at the slot until then, rule 7), so a late row of
a lagging front is never kept where an earlier duplicate exists, and never dropped in
favour of a later one. The output keeps the stream's columns in their order.

It runs on the keyed runtime (:mod:`.keyed_state`) grouped by buckets of the keys'
JSON (``lt_key``, exact as Spark compares values): a bucket keeps its pending rows and,
per key, its last kept row while it can still drop a row to come (``within`` after it;
for ever with ``within=None``, so the state grows with the distinct keys, as Spark's
streaming ``dropDuplicates`` without a watermark does). Deciding is a Python loop over
the rows the call steps (one dictionary lookup each).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.spark.operators.frames import StepError
from lowtide.spark.operators.joins import KEY_COL
from lowtide.spark.operators.keyed_state import GROUP_COL, StatefulSpec, key_json
from lowtide.spark.operators.slot_logic import (
    AT_COL,
    RUNTIME_COLS,
    SLOT_COL,
    WAKE_COL,
    KeptRows,
    UserState,
)
from lowtide.spark.operators.state_clock import check_keys, state_segment
from lowtide.spark.tracking.column import TRACKING_COLS

KEPT_COL = "lt_kept"  # 1: a row this step kept (and keeps for look-back)
BUCKETS = 8  # fixed, as the state is kept per bucket across restarts


@dataclass(frozen=True)
class DedupSpec:
    """A ``dropDuplicates`` step: ``subset`` None for all columns, ``within`` in slots
    (None: for ever)."""

    name: str
    subset: tuple[str, ...] | None
    within: int | None
    poll_ms: int = 100

    def segments(self) -> list[str]:
        return [self.name, state_segment(self.name)]


@dataclass(frozen=True)
class DedupLogic:
    """A bucket's step over all its rows (:class:`.slot_logic.RowLogic`); see the
    module docstring."""

    columns: tuple[str, ...]  # the output's columns, after lt_key
    within: int | None

    def run(self, key: tuple[Any, ...], rows: Any, done: int, user: UserState
            ) -> tuple[Any, Any]:
        import pandas as pd

        slot = rows[SLOT_COL].to_numpy(np.int64)
        keys = rows[KEY_COL].to_numpy(object)
        kept = (rows[KEPT_COL].fillna(0).to_numpy() if KEPT_COL in rows.columns
                else np.zeros(len(rows))).astype(bool)
        # the last kept row's slot per key (rows are sorted by slot, then ack id)
        last = dict(zip(keys[kept], slot[kept], strict=True))
        fresh = (rows[WAKE_COL].to_numpy(np.int64) == slot) & (slot < done)
        for i in np.flatnonzero(fresh):
            prev = last.get(keys[i])
            if prev is None or (self.within is not None and slot[i] - prev > self.within):
                kept[i] = True
                last[keys[i]] = slot[i]
        out = rows.loc[fresh & kept, [KEY_COL, *self.columns]].reset_index(drop=True)
        out[AT_COL] = slot[fresh & kept]
        rows[KEPT_COL] = kept.astype(np.int8)
        rows[WAKE_COL] = np.where(fresh, -1, rows[WAKE_COL].to_numpy(np.int64))
        latest = np.zeros(len(rows), bool)  # each key's last kept row
        latest[pd.Series(np.flatnonzero(kept)).groupby(keys[kept]).max().to_numpy(int)] = True
        reach = latest if self.within is None else latest & (slot + self.within >= done)
        return (out if len(out) else None), rows[(slot >= done) | reach]


def dedup_input(df: Any, spec: DedupSpec) -> tuple[Any, StatefulSpec]:
    """The step's input (``lt_key`` added) and the keyed step that drops duplicates
    (its output has ``lt_key`` first, which :func:`.joins.joined` drops); a one-line
    error for a subset column the stream lacks."""
    fields = {f.name: f.dataType.simpleString() for f in df.schema.fields
              if f.name not in TRACKING_COLS}
    subset = spec.subset if spec.subset is not None else tuple(fields)
    check_keys(f"dropDuplicates {spec.name!r}", subset, fields)
    taken = sorted(set(fields) & {KEY_COL, KEPT_COL, AT_COL, GROUP_COL, *RUNTIME_COLS})
    if taken:
        raise StepError(f"dropDuplicates {spec.name!r}: column {taken[0]!r} is a name "
                        "lowtide uses: rename it (withColumnRenamed)")
    df = df.withColumn(KEY_COL, key_json(subset, fields, null_if_null=False))
    schema = ", ".join(f"`{c}` {t}" for c, t in fields.items())
    logic = DedupLogic(tuple(fields), spec.within)
    return df, StatefulSpec(spec.name, (KEY_COL,), KeptRows(logic), schema, spec.poll_ms,
                           BUCKETS, what="dropDuplicates")
