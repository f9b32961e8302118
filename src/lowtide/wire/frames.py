"""Framing: a connection starts with a 4-byte preamble, then carries frames of a
4-byte little-endian payload length followed by the payload (see :mod:`.codec`).

The decoder is incremental and pure, so limits are testable without sockets:

>>> d = FrameDecoder(max_frame=16)
>>> d.feed(frame(b"abc") + frame(b"de")[:3])
[b'abc']
>>> d.feed(frame(b"de")[3:])
[b'de']
>>> d.feed(b"\\xff\\xff\\x00\\x00")
Traceback (most recent call last):
...
lowtide.wire.frames.FrameTooLarge: frame of 65535 bytes exceeds the limit of 16
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from lowtide.wire.buffers import WireError

#: Sent once by the client before its first frame; tells a lowtide peer from a stray
#: HTTP client or port scanner before any parsing happens.
PREAMBLE = b"LTW\x01"
HEADER = struct.Struct("<I")
DEFAULT_MAX_FRAME = 64 << 20
TAG_BYTES = 32
_SEQ = struct.Struct("<Q")


class FrameTooLarge(WireError):
    """A length prefix above the limit: the stream cannot be trusted any further."""


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def check_length(length: int, max_frame: int) -> None:
    if length > max_frame:
        raise FrameTooLarge(f"frame of {length} bytes exceeds the limit of {max_frame}")


class FrameDecoder:
    """Bytes in, complete payloads out."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        pos = 0
        while len(self._buf) - pos >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buf, pos)
            check_length(length, self.max_frame)
            end = pos + HEADER.size + length
            if end > len(self._buf):
                break
            out.append(bytes(self._buf[pos + HEADER.size : end]))
            pos = end
        del self._buf[:pos]
        return out

    def buffered(self) -> int:
        return len(self._buf)


class FrameForged(WireError):
    """A sealed frame whose tag does not verify: altered, replayed, reordered, or not
    from the peer that proved the secret. Nothing after it can be trusted."""


class FrameSeal:
    """Seals (or opens) the frames of one direction of a connection: the payload
    followed by HMAC-SHA256(key, frame number | payload). The number (counted, never
    sent) makes a replayed, dropped or reordered frame fail like an altered one.

    >>> out, into = FrameSeal(b"k" * 32), FrameSeal(b"k" * 32)
    >>> bytes(into.open(out.seal(b"ack")))
    b'ack'
    >>> sealed = bytearray(out.seal(b"ack"))
    >>> sealed[0] ^= 1
    >>> into.open(bytes(sealed))
    Traceback (most recent call last):
    ...
    lowtide.wire.frames.FrameForged: frame 1 failed its integrity check
    """

    def __init__(self, key: bytes) -> None:
        self._mac = hmac.new(key, digestmod=hashlib.sha256)  # keyed once, copied per frame
        self._seq = 0

    def _tag(self, payload: bytes | memoryview) -> bytes:
        mac = self._mac.copy()
        mac.update(_SEQ.pack(self._seq))
        mac.update(payload)
        self._seq += 1
        return mac.digest()

    def seal(self, payload: bytes) -> bytes:
        return payload + self._tag(payload)

    def open(self, sealed: bytes | memoryview) -> memoryview:
        seq = self._seq
        view = memoryview(sealed)
        payload, tag = view[: len(view) - TAG_BYTES], view[len(view) - TAG_BYTES :]
        if len(view) < TAG_BYTES or not hmac.compare_digest(self._tag(payload), tag):
            raise FrameForged(f"frame {seq} failed its integrity check")
        return payload
