"""The ingest log: framing, offsets, time index, torn-write recovery."""

from __future__ import annotations

import os

import numpy as np
import pytest

from lowtide.spark.sources.ingest import (
    IngestReader,
    IngestWriter,
    index_path,
    list_fronts,
    log_path,
)


def test_append_read_roundtrip(tmp_path) -> None:
    w = IngestWriter(tmp_path, front=1, fsync="never")
    expected: list[tuple[int, bytes]] = []
    for k in range(20):
        payloads = [f"{k}-{i}".encode() * (i % 3) for i in range(k % 5)]
        w.append(payloads, time=100 + k)
        expected += [(100 + k, p) for p in payloads]
    w.close()
    r = IngestReader(tmp_path, front=1)
    assert r.end_offset() == len(expected)
    for start, end in [(0, len(expected)), (3, 7), (5, 5), (len(expected) - 1, len(expected))]:
        times, payloads = r.read(start, end)
        assert list(zip(times.tolist(), payloads.to_pylist(), strict=True)) == expected[start:end]
    with pytest.raises(IndexError):
        r.read(0, len(expected) + 1)
    assert list_fronts(tmp_path) == [1]


def test_per_record_times_and_time_index(tmp_path) -> None:
    w = IngestWriter(tmp_path, front=2, fsync="always")
    w.append([b"a", b"b", b"c"], time=[5, 6, 6])
    w.append([b"d"], time=9)
    r = IngestReader(tmp_path, front=2)
    assert [r.offset_of_time(t) for t in (0, 5, 6, 7, 9, 10)] == [0, 0, 1, 3, 3, 4]
    with pytest.raises(ValueError):
        w.append([b"x"], time=8)  # times never go back within a front
    w.close()


def test_reopen_continues_offsets(tmp_path) -> None:
    with IngestWriter(tmp_path, front=0, fsync="never") as w:
        w.append([b"a", b"b"], time=1)
    with IngestWriter(tmp_path, front=0, fsync="never") as w:
        assert w.end_offset == 2 and w.last_time == 1
        assert w.append([b"c"], time=2) == 2
    times, payloads = IngestReader(tmp_path, 0).read(0, 3)
    assert payloads.to_pylist() == [b"a", b"b", b"c"] and times.tolist() == [1, 1, 2]


def test_torn_writes_are_dropped_on_recovery(tmp_path) -> None:
    with IngestWriter(tmp_path, front=0, fsync="never") as w:
        w.append([b"a"], time=1)
        w.append([b"bb", b"cc"], time=2)
    # a frame written but not indexed, and a torn index entry
    with open(log_path(tmp_path, 0), "ab") as f:
        f.write(b"\x00" * 37)
    with open(index_path(tmp_path, 0), "ab") as f:
        f.write(b"\x01" * 11)
    r = IngestReader(tmp_path, 0)
    assert r.end_offset() == 3  # readers ignore what the index does not cover
    with IngestWriter(tmp_path, front=0, fsync="never") as w:
        assert w.end_offset == 3
        w.append([b"d"], time=3)
    assert IngestReader(tmp_path, 0).read(0, 4)[1].to_pylist() == [b"a", b"bb", b"cc", b"d"]


def test_corrupt_last_frame_is_truncated(tmp_path) -> None:
    with IngestWriter(tmp_path, front=0, fsync="never") as w:
        w.append([b"a"], time=1)
        w.append([b"zzzz"], time=2)
    size = os.path.getsize(log_path(tmp_path, 0))
    with open(log_path(tmp_path, 0), "r+b") as f:  # flip a payload byte of frame 2
        f.seek(size - 1)
        f.write(b"Y")
    with IngestWriter(tmp_path, front=0, fsync="never") as w:
        assert w.end_offset == 1
    assert IngestReader(tmp_path, 0).end_offset() == 1


def test_large_frame_is_columnar(tmp_path) -> None:
    n = 50_000
    payloads = [i.to_bytes(4, "little") for i in range(n)]
    with IngestWriter(tmp_path, front=3, fsync="never") as w:
        w.append(payloads, time=7)
    times, arr = IngestReader(tmp_path, 3).read(10, n)
    assert (times == 7).all() and len(arr) == n - 10
    assert arr[0].as_py() == (10).to_bytes(4, "little")
    assert np.frombuffer(arr.buffers()[2], np.uint8).size >= 4 * (n - 10)
