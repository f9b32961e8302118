"""On-disk formats: write-ahead log records and tracker snapshots.

A log record is ``length, crc32, payload`` with the payload an encoded message.
:func:`read_records` yields the intact records from the start; where it stops, either
the log ends, or a crash tore the last write (:func:`torn_at`: the record there runs
past the end), or something damaged it (any other case, and always when an intact
Commit marker follows: a tear never leaves whole records behind it). A snapshot is a
JSON header plus packed arrays.

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

from lowtide.wire.buffers import WireError
from lowtide.wire.codec import decode, encode
from lowtide.wire.messages import Commit, Message

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


def torn_at(data: bytes, pos: int) -> bool:
    """Whether reading stopped at ``pos`` because the last write was cut short: the
    record there is incomplete (or the rest is zeros, as a file extended but never
    written reads after a power loss), and no intact Commit marker lies beyond it."""
    rest = data[pos:]
    if rest.count(0) != len(rest) and len(rest) >= _RECORD.size:
        (length,) = struct.unpack_from("<I", rest)
        if _RECORD.size + length <= len(rest):
            return False  # complete, yet unreadable: damaged, not torn
    return next_commit(data, pos + 1) is None


def next_commit(data: bytes, start: int) -> int | None:
    """The offset of the first intact Commit record at or after ``start``, if any: a
    search for its fixed header, each hit checked by its CRC."""
    probe = encode(Commit(0))
    head = struct.pack("<I", len(probe))
    pos = data.find(head, start)
    while pos >= 0:
        payload = data[pos + _RECORD.size : pos + _RECORD.size + len(probe)]
        if payload[:1] == probe[:1] and len(payload) == len(probe):
            (crc,) = struct.unpack_from("<I", data, pos + 4)
            if zlib.crc32(payload) == crc:
                return pos
        pos = data.find(head, pos + 1)
    return None


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
    try:
        return _decode_snapshot(data)
    except (struct.error, ValueError, KeyError, TypeError) as exc:
        raise WireError(f"damaged snapshot: {exc}") from None


def _decode_snapshot(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
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
