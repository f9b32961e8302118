"""The byte format alone: round trips, limits, and refusal of malformed bytes."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lowtide.core.messages import (
    AckBatch,
    Heartbeat,
    NodeTime,
)
from lowtide.wire import FrameDecoder, FrameTooLarge, WireError, decode, encode, frame
from lowtide.wire.log import decode_snapshot, encode_snapshot, read_records, record, torn_at
from lowtide.wire.messages import (
    Batch,
    Commit,
    FrontOp,
    Ok,
)
from tests.wire.helpers import SAMPLES


def acks(n: int) -> AckBatch:
    rng = np.random.default_rng(n)
    return AckBatch.from_columns(
        rng.integers(0, 3, n),
        rng.integers(0, 1 << 40, n),
        rng.integers(0, 1 << 63, n),
        rng.integers(-5, 5, n),
    )


def same_batch(a: Batch, b: Batch) -> bool:
    cols = ("segment", "time", "xor", "count")
    return (a.req, a.session, a.key, a.heartbeats, a.node_time) == (
        b.req,
        b.session,
        b.key,
        b.heartbeats,
        b.node_time,
    ) and all(np.array_equal(getattr(a.acks, c), getattr(b.acks, c)) for c in cols)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: object) -> None:
    assert decode(encode(msg)) == msg  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_batch_round_trip_is_packed(n: int) -> None:
    msg = Batch(1, 2, "k", acks(n), (Heartbeat(1, 5),), NodeTime(3, 4, 5))
    data = encode(msg)
    assert len(data) < 28 * n + 200  # 28 bytes per ack: packed columns, no per-ack objects
    assert same_batch(decode(data), msg)  # type: ignore[arg-type]


@given(st.binary(max_size=300))
def test_garbage_is_refused_with_wire_error_only(data: bytes) -> None:
    with contextlib.suppress(WireError):
        decode(data)


@given(st.sampled_from(SAMPLES), st.data())
def test_mutated_messages_decode_or_raise_wire_error(msg: object, data: st.DataObject) -> None:
    raw = bytearray(encode(msg))  # type: ignore[arg-type]
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    with contextlib.suppress(WireError):
        decode(bytes(raw[:cut]))


def test_trailing_bytes_are_refused() -> None:
    with pytest.raises(WireError, match="trailing"):
        decode(encode(Ok(1)) + b"x")


def test_frame_limit() -> None:
    dec = FrameDecoder(max_frame=10)
    assert dec.feed(frame(b"0123456789")) == [b"0123456789"]
    with pytest.raises(FrameTooLarge):
        dec.feed(frame(b"0123456789a"))


def test_log_records_stop_at_a_torn_or_corrupt_tail() -> None:
    good = record(Commit(1)) + record(FrontOp(1, 1, True, 1, "src", 0))
    torn = good + record(Commit(2))[:-2]
    assert [m for m, _ in read_records(torn)] == [Commit(1), FrontOp(1, 1, True, 1, "src", 0)]
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    assert [m for m, _ in read_records(bytes(corrupt))] == [Commit(1)]


def test_snapshot_round_trip() -> None:
    arrays = {"a": np.arange(5, dtype=np.int64), "b": np.array([1, 2], np.uint64)}
    meta, back = decode_snapshot(encode_snapshot({"x": [1, "y"]}, arrays))
    assert meta == {"x": [1, "y"]}
    assert all(np.array_equal(arrays[k], back[k]) for k in arrays)
    data = bytearray(encode_snapshot({}, arrays))
    data[-1] ^= 1
    with pytest.raises(WireError):
        decode_snapshot(bytes(data))


def test_a_torn_tail_is_told_from_damage() -> None:
    log = record(Commit(1)) + record(Commit(2)) + record(Commit(3))
    first = len(record(Commit(1)))
    assert torn_at(log[:-4], 2 * first)  # the last write cut short
    assert torn_at(log[: 2 * first] + b"\0" * 30, 2 * first)  # extended, never written
    flipped = bytearray(log)
    flipped[first + 9] ^= 1  # inside the second record: the third still reads
    stop = [end for _m, end in read_records(bytes(flipped))][-1]
    assert stop == first and not torn_at(bytes(flipped), stop)
    flipped = bytearray(log)
    flipped[-1] ^= 1  # the last record complete but wrong: damage, not a tear
    assert not torn_at(bytes(flipped), 2 * first)
