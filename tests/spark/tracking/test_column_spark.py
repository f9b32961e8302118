"""The sinks' Spark expressions over the tracking column agree with the numpy ones."""

from __future__ import annotations

import numpy as np
import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.spark.tracking import (
    WRAP_SLOTS,
    AckAccumulator,
    ack_ids,
    pack,
    reference_slot,
    slots_of,
)
from lowtide.spark.tracking.transport import TrackerRef

GRID = TimeGrid(delta_ms=10)
GRAPH = SegmentGraph.of(("m", ()), ("sink", ("m",)))


def _rows(ref: int, n: int = 400) -> np.ndarray:
    rng = np.random.default_rng(5)
    slots = (ref + rng.integers(-6, 6, n)).astype(np.int64)
    return pack(slots, rng.integers(0, 2**63, n).astype(np.uint64), ref)


@pytest.mark.spark
@pytest.mark.parametrize("edge", [None, 0, 2**31], ids=["now", "0 mod 2**32", "2**31 mod 2**32"])
def test_unpacked_columns_equal_numpy_unwrap(spark, edge: int | None) -> None:
    from lowtide.spark.sinks import unpacked_columns

    ref = reference_slot(GRID) if edge is None else 40 * WRAP_SLOTS + edge
    packed = _rows(ref)
    df = spark.createDataFrame([(int(p),) for p in packed], "lt_track long")
    got = unpacked_columns(df, ref).collect()
    assert [r["lt_time"] for r in got] == slots_of(packed, ref).tolist()
    assert [r["lt_ack"] for r in got] == ack_ids(packed).tolist()


@pytest.mark.spark
def test_foreach_batch_receipts_equal_the_numpy_receipts(spark) -> None:
    """The foreachBatch sink reduces in the JVM (group by the slot bits, bit_xor): the
    same (time, XOR, count) entries as a Python receiver of the same rows."""
    from lowtide.spark.sinks import TrackedForeachBatch

    ref = reference_slot(GRID)
    packed = _rows(ref)
    df = spark.createDataFrame([(int(p),) for p in packed], "lt_track long")
    sink = TrackedForeachBatch(None, TrackerRef("memory://x", GRAPH, GRID), "sink")
    jvm = sink.acks_of(df).build(GRID.window_slots)
    py = AckAccumulator()
    py.add_packed(GRAPH.index("sink"), packed, ref, -1)
    want = py.build(GRID.window_slots)
    for col in ("segment", "time", "xor", "count"):
        assert getattr(jvm, col).tolist() == getattr(want, col).tolist()
