"""On-disk formats: write-ahead log records and tracker snapshots.

A log record is ``length, crc32, payload`` with the payload an encoded message; a
torn or corrupt tail (a crash mid-write) ends the readable log, and nothing after it
was ever confirmed to a client. A snapshot is a JSON header plus packed arrays.

>>> from lowtide.wire.messages import Commit
>>> data = record(Commit(5)) + record(Commit(6))[:-1]
>>> [m for m, _end in read_records(data)]
[Commit(now_ms=5)]
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from lowtide.wire.codec import WireError, decode, encode
from lowtide.wire.messages import Message

_RECORD = struct.Struct("<II")
_SNAP_MAGIC = b"LTSNAP01"


def record(msg: Message) -> bytes:
    payload = encode(msg)
    return _RECORD.pack(len(payload), zlib.crc32(payload)) + payload


def read_records(data: bytes) -> Iterator[tuple[Message, int]]:
    """(message, offset just past it) for every intact record from the start."""
    pos = 0
    while pos + _RECORD.size <= len(data):
        length, crc = _RECORD.unpack_from(data, pos)
        end = pos + _RECORD.size + length
        payload = data[pos + _RECORD.size : end]
        if end > len(data) or zlib.crc32(payload) != crc:
            return
        try:
            msg = decode(payload)
        except WireError:
            return
        yield msg, end
        pos = end


def encode_snapshot(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray[Any, Any]]) -> bytes:
    """``meta``: JSON-able; ``arrays``: named 1-D numeric arrays."""
    layout = {k: [a.dtype.str, len(a)] for k, a in arrays.items()}
    header = json.dumps({"meta": meta, "arrays": layout}).encode()
    body = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays.values())
    head = _SNAP_MAGIC + struct.pack("<Q", len(header)) + header
    return head + struct.pack("<I", zlib.crc32(head + body)) + body


def decode_snapshot(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
    if not data.startswith(_SNAP_MAGIC):
        raise WireError("not a lowtide snapshot")
    (n,) = struct.unpack_from("<Q", data, len(_SNAP_MAGIC))
    start = len(_SNAP_MAGIC) + 8
    head_end = start + n
    (crc,) = struct.unpack_from("<I", data, head_end)
    body = data[head_end + 4 :]
    if zlib.crc32(data[:head_end] + body) != crc:
        raise WireError("snapshot checksum mismatch")
    header = json.loads(data[start:head_end])
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    pos = 0
    for name, (dtype_str, length) in header["arrays"].items():
        dtype = np.dtype(dtype_str)
        size = dtype.itemsize * length
        arrays[name] = np.frombuffer(body[pos : pos + size], dtype=dtype).copy()
        pos += size
    return header["meta"], arrays
