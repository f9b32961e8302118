"""Keyed state in global time order, on the state clock: the one runtime of every exact
stateful step. A user's own step (``stream.stateful``), the windows
(:mod:`.window_state`) and the joins (:mod:`.joins`) are slot logics
(:mod:`.slot_logic`) on it.

::

    def running(key, rows, total):          # one key's rows of one complete slot
        total = (total or 0) + len(rows)
        return total, pandas.DataFrame({"n": [total]})

    counts = stream.stateful(running, "n long", key="user", name="running")

The contract of ``stateful``: for each key, ``fn(key, rows, state) -> (state, out)``
is called once per slot (``delta_ms`` of global time) that has rows of the key, in
ascending slot order, once the step's inbound segment is complete below that slot;
``rows`` (a pandas DataFrame of the stream's columns, tracking columns left out) are
ALL the key's rows of the slot, in a fixed order (by ack id). ``state`` is what the
previous call returned for the key (None at first; return None to drop it); it lives
in the state store and survives restarts from the checkpoint. ``out`` (a DataFrame
with the columns of ``schema``, or None) are output rows at that slot, after the key
columns. So the output equals a batch fold over the key's rows sorted by slot,
whatever the micro-batches, lags and retries were; ``fn`` must be deterministic (Spark
re-runs tasks). Until a slot's call has run, its rows are pending state: a hold at the
slot keeps the min time of everything downstream at or below it (rule 7).

How it runs: ``groupBy(lt_group).transformWithStateInPandas`` with ``lt_group`` the
keys' JSON (:func:`key_json`: never a null grouping key), or, for a step that is
vectorised over keys (a join, a window with key ranges), ``pmod(xxhash64(keys),
buckets)``: one call per group
(a key or a bucket of keys) and batch, by ONE processor
(:class:`.state_processor.SlotProcessor`). A group's state is one named record
(:class:`.state_processor.GroupRecord`): the key hash its holds descend from, the
slots of its open holds (its wakes), the key as its rows have it, the logic's own
state. Each call receives the new rows out of the inbound segment, asks
:meth:`.StateClock.complete_below` (``done``; a bucket's key ranges together, one
round trip), runs the logic (:func:`.slot_logic.step_ranges`: a group without key
ranges is one range), opens the holds of new wakes, sends the outputs as
children of their slot's hold and releases the holds whose wakes are gone, all in the
task's one batch (children first). A group with open holds looks again every
``poll_ms`` (a processing-time timer); a timer call that finds no wake below ``done``
reads the record only, and a timer call of a group that its rows' call stepped in the
same batch (same timestamp, same ``done``: every wake is at or above it) reads
nothing (an ``eager`` step's still steps).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.spark.operators.slot_logic import SlotLogic
from lowtide.spark.operators.state_clock import StatefulStep
from lowtide.spark.tracking.column import TRACK_COL
from lowtide.spark.tracking.transport import TrackerRef

# what the runtime groups by: a join's bucket of keys, or the exact key as JSON (never
# a null key: PySpark 4.2 hands a null grouping key's rows out one per call and mixed
# another key's rows into its state in our tests)
GROUP_COL = "lt_group"


@dataclass(frozen=True)
class StatefulSpec(StatefulStep):
    """A keyed step of a :class:`lowtide.spark.pipeline.stream.Stream` (``stateful``,
    a window's, a join's): ``buckets`` > 0 groups the keys into that many buckets;
    ``what`` names the step in errors."""

    name: str
    keys: tuple[str, ...]
    logic: SlotLogic
    schema: str  # DDL of the output columns after the keys
    poll_ms: int = 100
    buckets: int = 0
    what: str = "stateful"
    #: 0, or the key ranges of the inbound segment (rule 15): a row's range is its
    #: front's (:mod:`lowtide.spark.tracking.key_ranges`); with ``buckets``, each range
    #: of a bucket is stepped as a group of its own, with that range's min time
    #: (:func:`.slot_logic.step_ranges`), and the logic's state is a dict by key (a
    #: key's rows of two ranges are refused)
    key_ranges: int = 0
    eager: bool = False  # step at every poll, not only once a wake is complete (rule 13)
    #: the rows are not items but Spark's running values (a speculative window planned
    #: in the JVM, whose senders received its rows): nothing to receive, SLOT_COL given
    received: bool = False
    #: the logic keeps row parts (``LogicStep.appends``): the processor declares their
    #: map state; a logic without them saves that state variable's set-up in every task
    row_parts: bool = True


class KeyedStep(StatefulStep):
    """A step description that is planned as a keyed step on this runtime (session
    windows, ``groupBy().agg()``): the builder calls :meth:`keyed_input`."""

    def keyed_input(self, df: Any, delta_ms: int) -> tuple[Any, StatefulSpec]:
        """(the step's input, prepared in the JVM; the keyed step over it); raises a
        one-line ``ValueError`` for what the input's schema does not allow."""
        raise NotImplementedError


@dataclass(frozen=True)
class KeyedRuntime:
    """What the processor needs on the executors (pickled with it)."""

    spec: StatefulSpec
    ref: TrackerRef
    out_segment: str
    op_id: int
    key_types: tuple[str, ...]

    def output_schema(self) -> str:
        cols = [f"`{k}` {t}" for k, t in zip(self.spec.keys, self.key_types, strict=True)]
        return ", ".join([*cols, self.spec.schema, f"{TRACK_COL} long"])


def key_values(rows: Any, keys: tuple[str, ...]) -> tuple[Any, ...]:
    """A group's key values, from its first row (Python scalars, None for null)."""
    return key_rows(rows, keys, [0])[0]


def key_rows(rows: Any, keys: tuple[str, ...], at: list[int]) -> list[tuple[Any, ...]]:
    """:func:`key_values` of the rows at positions ``at``, one pass per key column."""
    import pandas as pd

    def scalar(v: Any) -> Any:
        if v is None or v is pd.NaT or (isinstance(v, float) and v != v):  # NaN
            return None
        return v.item() if isinstance(v, np.generic) else v

    cols = [rows[k].iloc[at].tolist() for k in keys]
    return [tuple(scalar(v) for v in row) for row in zip(*cols, strict=True)] if cols \
        else [() for _ in at]


def shuffle_buckets(spark: Any, checkpoint: str | None) -> int:
    """How many buckets a step groups its keys into: the query's shuffle partitions, as
    its checkpoint's offset log keeps them (Spark restores them on a restart, whatever
    the session says; a key's state lives in its bucket); the session's without one."""
    offsets = Path(checkpoint or "") / "offsets"
    logged = [int(p.name) for p in offsets.iterdir() if p.name.isdigit()] \
        if checkpoint and offsets.is_dir() else []
    if logged:
        for line in (offsets / str(max(logged))).read_text().splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                conf = json.loads(line).get("conf", {})
                if "spark.sql.shuffle.partitions" in conf:
                    return int(conf["spark.sql.shuffle.partitions"])
    return int(spark.conf.get("spark.sql.shuffle.partitions"))


def bucket_labels(spark: Any, buckets: int) -> list[int]:
    """A label per bucket that Spark's hash partitioning into ``buckets`` partitions
    sends to partition ``b`` (the first such number for each): one bucket per task,
    where the buckets themselves could share a partition and leave another idle."""
    from pyspark.sql import functions as F

    parts = spark.range(0, 64 * buckets).select(
        "id", F.pmod(F.hash("id"), F.lit(buckets)).alias("p")).groupBy("p").agg(
        F.min("id").alias("label")).collect()
    labels = {int(r["p"]): int(r["label"]) for r in parts}
    return [labels[b] for b in range(buckets)]


def key_groups(rows: Any, keys: tuple[str, ...]) -> tuple[list[tuple[Any, ...]], list[Any]]:
    """The distinct keys of ``rows`` (as :func:`key_values` has them) and each one's row
    positions, by first appearance."""
    codes = rows.groupby(list(keys), dropna=False, sort=False).ngroup().to_numpy()
    order = np.argsort(codes, kind="stable")
    at = np.split(order, np.flatnonzero(np.diff(codes[order])) + 1)
    return key_rows(rows, keys, [int(i[0]) for i in at]), at


def key_json(keys: tuple[str, ...], types: dict[str, str], *, null_if_null: bool) -> Any:
    """The keys as one exact string, as Spark compares them (JSON of their struct; NaN
    equal to NaN, -0.0 made 0.0 by adding 0.0); ``null_if_null``: null when a key is
    null (a join's: SQL's null matches nothing), else a null key is a key like any
    other."""
    from pyspark.sql import functions as F

    cols = [F.col(f"`{k}`") + F.lit(0.0) if types[k] in ("float", "double")
            else F.col(f"`{k}`") for k in keys]
    text = F.to_json(F.struct(*[c.alias(f"k{i}") for i, c in enumerate(cols)]))
    if not null_if_null:
        return text
    any_null = F.greatest(*[F.col(f"`{k}`").isNull() for k in keys]) if len(keys) > 1 \
        else F.col(f"`{keys[0]}`").isNull()
    return F.when(any_null, F.lit(None)).otherwise(text)
