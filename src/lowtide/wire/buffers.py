"""Reading and writing the wire's primitive fields: fixed-width integers, bounded
strings and blobs, and packed numpy columns. A :class:`Reader` refuses anything
malformed or oversized with :class:`WireError` and nothing else."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from lowtide.core.errors import LowtideError

#: Bounds on variable-length fields, so a hostile length cannot make us allocate.
MAX_STRING = 1 << 20
MAX_ITEMS = 1 << 24


class WireError(LowtideError, ValueError):
    """Bytes that are not a well-formed message of this wire version."""


class Writer:
    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def pack(self, fmt: str, *values: int) -> None:
        self._parts.append(struct.pack("<" + fmt, *values))

    def text(self, value: str) -> None:
        self.blob(value.encode())

    def blob(self, value: bytes) -> None:
        self.pack("I", len(value))
        self._parts.append(value)

    def opt_text(self, value: str | None) -> None:
        self.pack("B", value is not None)
        if value is not None:
            self.text(value)

    def array(self, values: np.ndarray[Any, Any], dtype: np.dtype[Any]) -> None:
        self._parts.append(np.ascontiguousarray(values, dtype=dtype).tobytes())

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


class Reader:
    def __init__(self, data: bytes | memoryview) -> None:
        self._data = memoryview(data)
        self._pos = 0

    def take(self, n: int) -> memoryview:
        end = self._pos + n
        if n < 0 or end > len(self._data):
            raise WireError(f"truncated message: need {n} bytes at offset {self._pos}")
        out = self._data[self._pos : end]
        self._pos = end
        return out

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        s = struct.Struct("<" + fmt)
        return s.unpack(self.take(s.size))

    def one(self, fmt: str) -> int:
        value: int = self.unpack(fmt)[0]
        return value

    def count(self) -> int:
        n = self.one("I")
        if n > MAX_ITEMS:
            raise WireError(f"{n} items exceed the limit of {MAX_ITEMS}")
        return n

    def text(self) -> str:
        return bytes(self.blob(MAX_STRING)).decode()

    def blob(self, limit: int = MAX_STRING) -> memoryview:
        n = self.one("I")
        if n > limit:
            raise WireError(f"a {n}-byte field exceeds the limit of {limit}")
        return self.take(n)

    def opt_text(self) -> str | None:
        return self.text() if self.one("B") else None

    def array(self, n: int, dtype: np.dtype[Any], native: type) -> np.ndarray[Any, Any]:
        raw = self.take(n * dtype.itemsize)
        return np.frombuffer(raw, dtype=dtype).astype(native, copy=False)

    def end(self) -> None:
        if self._pos != len(self._data):
            raise WireError(f"{len(self._data) - self._pos} trailing bytes")


# ------------------------------------------------------------------ fields
