"""The Arrow halves of ``where`` and ``explode`` without Spark: what they ack."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from lowtide.spark.operators.frames import KEEP_COL, POS_COL, frame_acks
from lowtide.spark.tracking import TRACK_COL, AckAccumulator, ack_ids, pack

REF = 180_000_000_000
PARENTS = pack(np.array([REF, REF, REF + 1], np.int64), np.array([11, 22, 33], np.uint64), REF)


def exploded() -> pa.RecordBatch:
    """posexplode_outer of parents 11 (2 elements), 22 (none), 33 (1 element)."""
    return pa.record_batch({
        "x": pa.array([5, 6, None, 7], pa.int64()),
        TRACK_COL: pa.array(PARENTS[[0, 0, 1, 2]], pa.int64()),
        POS_COL: pa.array([0, 1, None, 0], pa.int32()),
    })


def test_explode_receives_each_parent_once_and_sends_each_element() -> None:
    acc = AckAccumulator()
    out = frame_acks("explode", exploded(), acc, (1, 2), REF, salt=7)
    assert out.schema.names == ["x", TRACK_COL]
    assert out["x"].to_pylist() == [5, 6, 7]
    batch = acc.build(1)  # one slot per window
    assert acc.rows_received == 3 and acc.rows_sent == 3
    keys = zip(batch.segment.tolist(), batch.time.tolist(), strict=True)
    got = dict(zip(keys, batch.count.tolist(), strict=True))
    assert got == {(1, REF): -2, (1, REF + 1): -1, (2, REF): 2, (2, REF + 1): 1}
    # the same ids whatever the batch boundaries (a retry may cut batches elsewhere)
    rows = exploded()
    again = [frame_acks("explode", rows.slice(i, 1), AckAccumulator(), (1, 2), REF, 7)
             for i in range(rows.num_rows)]
    ids = np.concatenate([ack_ids(np.asarray(b[TRACK_COL])) for b in again])
    assert ids.tolist() == ack_ids(np.asarray(out[TRACK_COL])).tolist()
    assert len(set(ids.tolist())) == 3


def test_where_drops_false_and_acks_like_a_filter() -> None:
    acc = AckAccumulator()
    batch = pa.record_batch({"x": pa.array([1, 2, 3]), TRACK_COL: pa.array(PARENTS),
                             KEEP_COL: pa.array([True, False, True])})
    out = frame_acks("where", batch, acc, (1, 2), REF, salt=7)
    assert out.schema.names == ["x", TRACK_COL] and out["x"].to_pylist() == [1, 3]
    assert acc.rows_received == 3 and acc.rows_sent == 2


def joined(how: str) -> pa.RecordBatch:
    """The JVM half of a stream-static join of parents 11 (2 matches), 22 (none) and 33
    (1 match): left-outer joined rows, positions per key; under ``left`` the unmatched
    row's position is 0."""
    return pa.record_batch({
        "name": pa.array(["a", "b", None, "c"]),
        TRACK_COL: pa.array(PARENTS[[0, 0, 1, 2]], pa.int64()),
        POS_COL: pa.array([0, 1, 0 if how == "left" else None, 0], pa.int32()),
    })


def test_enrich_acks_each_stream_row_once_and_each_match_as_a_child() -> None:
    inner, left = AckAccumulator(), AckAccumulator()
    out_inner = frame_acks("enrich", joined("inner"), inner, (1, 2), REF, salt=7)
    out_left = frame_acks("enrich", joined("left"), left, (1, 2), REF, salt=7)
    assert out_inner["name"].to_pylist() == ["a", "b", "c"]  # 22 matched nothing: dropped
    assert out_left["name"].to_pylist() == ["a", "b", None, "c"]  # kept, with nulls
    assert (inner.rows_received, inner.rows_sent) == (3, 3)
    assert (left.rows_received, left.rows_sent) == (3, 4)
    ids_inner = ack_ids(np.asarray(out_inner[TRACK_COL])).tolist()
    ids_left = ack_ids(np.asarray(out_left[TRACK_COL])).tolist()
    assert ids_left[:2] + ids_left[3:] == ids_inner  # a match's id: (parent, salt, position)
    assert len(set(ids_left)) == 4
