"""AckBatch columns and the message dataclasses."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lowtide.core.messages import Ack, AckBatch, Heartbeat, MinTimeUpdate


def test_of_and_to_acks_round_trip() -> None:
    acks = [Ack(0, 5, 0xAB, 1), Ack(1, 5, 0xAB, -1), Ack(2, 1 << 40, (1 << 64) - 1, 3)]
    batch = AckBatch.of(acks)
    assert len(batch) == 3
    assert batch.to_acks() == acks
    assert batch.segment.dtype == np.int32
    assert batch.time.dtype == np.int64
    assert batch.xor.dtype == np.uint64
    assert batch.count.dtype == np.int64


def test_from_columns_broadcasts_scalar_segment_and_count() -> None:
    batch = AckBatch.from_columns(2, [10, 11, 12], [1, 2, 3], -1)
    assert batch.to_acks() == [Ack(2, 10, 1, -1), Ack(2, 11, 2, -1), Ack(2, 12, 3, -1)]
    # the broadcast columns are real, writable copies
    assert batch.segment.flags.writeable and batch.count.flags.writeable


def test_empty_concat_and_take() -> None:
    empty = AckBatch.empty()
    assert len(empty) == 0 and empty.to_acks() == []
    assert len(AckBatch.concat([])) == 0
    a = AckBatch.of([Ack(0, 1, 1, 1)])
    b = AckBatch.of([Ack(1, 2, 2, 1), Ack(1, 3, 3, -1)])
    assert AckBatch.concat([a]) is a
    both = AckBatch.concat([a, b])
    assert both.to_acks() == a.to_acks() + b.to_acks()
    assert both.take(both.time >= 2).to_acks() == b.to_acks()
    assert both.take(np.array([2, 0])).to_acks() == [Ack(1, 3, 3, -1), Ack(0, 1, 1, 1)]


def test_columns_must_agree_in_length_and_dtype() -> None:
    with pytest.raises(ValueError):
        AckBatch(
            np.zeros(2, np.int32),
            np.zeros(1, np.int64),
            np.zeros(2, np.uint64),
            np.zeros(2, np.int64),
        )
    with pytest.raises(TypeError):
        AckBatch(
            np.zeros(1, np.int64),
            np.zeros(1, np.int64),
            np.zeros(1, np.uint64),
            np.zeros(1, np.int64),
        )
    with pytest.raises(TypeError):
        AckBatch(
            np.zeros(1, np.int32),
            np.zeros(1, np.int64),
            np.zeros(1, np.int64),
            np.zeros(1, np.int64),
        )


def test_messages_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Heartbeat(1, 2).time = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        MinTimeUpdate("s", 2).time = 3  # type: ignore[misc]
