"""A tracked step in a segment split into key ranges (rule 15), without Spark: each
range's rows are received and sent under that range's codes, a row keeps its range,
and a row no range lists is refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from lowtide.core.graph import SegmentGraph, SegmentSpec
from lowtide.spark.tracking.column import (
    TRACK_COL,
    AckAccumulator,
    attach,
    operator_salt,
    pack,
    track_children,
)
from lowtide.spark.tracking.key_ranges import by_range

REF = 1_000
# fronts 0 and 2 feed range 0, front 1 range 1
GRAPH = SegmentGraph.of(SegmentSpec("keep", (), 2, ((0, (0,)), (1, (1,)), (2, (0,)))),
                        SegmentSpec("win", ("keep",), 2), ("sink", ("win",)))
KEEP, WIN = GRAPH.index("keep"), GRAPH.index("win")


def rows(fronts: list[int]) -> pa.RecordBatch:
    n = len(fronts)
    packed = pack(np.full(n, REF, np.int64), np.arange(1, n + 1, dtype=np.uint64), REF)
    data = pa.record_batch({"front": pa.array(fronts, pa.int32()),
                            "seq": pa.array(np.arange(n), pa.int64())})
    return attach(data, packed)


def a_filter(acc: AckAccumulator, keep_even_seq: bool = True) -> Any:
    """A tracked filter's Arrow half: keep rows of even ``seq``."""

    def step(batch: pa.RecordBatch, in_code: int, out_code: int) -> pa.RecordBatch:
        names = batch.schema.names
        packed = batch.column(names.index(TRACK_COL)).to_numpy().astype(np.int64)
        mask = batch.column(names.index("seq")).to_numpy() % 2 == 0
        children = track_children(acc, (in_code, out_code), packed, REF, operator_salt(7),
                                  mask if keep_even_seq else None)
        kept = batch.filter(pa.array(mask)) if keep_even_seq else batch
        return attach(kept.drop_columns([TRACK_COL]), children)

    return step


def counts_by_code(acc: AckAccumulator) -> dict[int, int]:
    b = acc.build(window_slots=100)
    out: dict[int, int] = {}
    for code, count in zip(b.segment.tolist(), b.count.tolist(), strict=True):
        out[code] = out.get(code, 0) + count
    return out


def test_each_range_is_received_and_sent_under_its_own_codes() -> None:
    acc = AckAccumulator()
    out = by_range(GRAPH, KEEP, WIN, rows([0, 1, 2, 1, 0, 1]), a_filter(acc))
    # seq 0..5: kept 0, 2, 4 (fronts 0, 2, 0: range 0)
    assert sorted(out.column("seq").to_pylist()) == [0, 2, 4]
    assert counts_by_code(acc) == {GRAPH.cell(KEEP, 0): -3, GRAPH.cell(KEEP, 1): -3,
                                   GRAPH.cell(WIN, 0): 3}


def test_a_segment_without_ranges_is_one_call_under_its_index() -> None:
    plain = SegmentGraph.of(("keep", ()), ("win", ("keep",)))
    acc = AckAccumulator()
    by_range(plain, 0, 1, rows([0, 1, 2]), a_filter(acc, keep_even_seq=False))
    assert counts_by_code(acc) == {0: -3, 1: 3}


def test_a_step_that_moves_a_row_to_another_range_fails() -> None:
    def moves(batch: pa.RecordBatch, in_code: int, out_code: int) -> pa.RecordBatch:
        return batch.set_column(0, "front", pa.array([1] * batch.num_rows, pa.int32()))

    with pytest.raises(ValueError, match=r"moved rows from key range 0 to \[1\]"):
        by_range(GRAPH, KEEP, WIN, rows([0, 2]), moves)


def test_a_row_of_a_front_no_range_lists_fails() -> None:
    with pytest.raises(ValueError, match=r"rows of front\(s\) \[5\] reach 'keep'"):
        by_range(GRAPH, KEEP, WIN, rows([0, 5]), a_filter(AckAccumulator()))
