"""Decode the PNG screenshots a browser writes (8-bit RGB or RGBA, not interlaced)
with zlib and numpy alone, so the browser test needs no imaging library."""

from __future__ import annotations

import struct
import zlib

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {2: 3, 6: 4}  # colour type: RGB, RGBA


def decode(data: bytes) -> np.ndarray:
    """The image as a (height, width, channels) uint8 array."""
    if not data.startswith(SIGNATURE):
        raise ValueError("not a PNG")
    pos, chunks, header = len(SIGNATURE), [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    if depth != 8 or colour not in CHANNELS or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}")
    bpp = CHANNELS[colour]
    raw = zlib.decompress(b"".join(chunks))
    stride = width * bpp
    prev = np.zeros(stride, np.uint8)
    rows = []
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = np.frombuffer(raw, np.uint8, stride, start + 1)
        prev = _unfilter(kind, line, prev, bpp)
        rows.append(prev)
    return np.stack(rows).reshape(height, width, bpp)


def _unfilter(kind: int, line: np.ndarray, prev: np.ndarray, bpp: int) -> np.ndarray:
    if kind == 0:
        return line.copy()
    if kind == 1:  # Sub: a running sum per channel, modulo 256
        return np.cumsum(line.reshape(-1, bpp), axis=0, dtype=np.uint8).reshape(-1)
    if kind == 2:  # Up
        return line + prev
    if kind in (3, 4):
        return np.frombuffer(_sequential(kind, line.tobytes(), prev.tobytes(), bpp), np.uint8)
    raise ValueError(f"unknown PNG filter {kind}")


def _sequential(kind: int, line: bytes, prev: bytes, bpp: int) -> bytearray:
    """Average (3) and Paeth (4) depend on the byte just decoded: one at a time."""
    out = bytearray(len(line))
    for i, x in enumerate(line):
        a = out[i - bpp] if i >= bpp else 0
        b = prev[i]
        if kind == 3:
            out[i] = (x + (a + b) // 2) & 0xFF
            continue
        c = prev[i - bpp] if i >= bpp else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        out[i] = (x + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
    return out
