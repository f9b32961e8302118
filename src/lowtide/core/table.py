"""Checksum table: per segment, a ring of (XOR, count) by tracking window.

All segments share one 2-D ring (segment x capacity); window ``w`` lives in column
``w & (capacity - 1)``. Each segment keeps a *base*: the oldest window it may still
receive acks for. Windows in ``[base, base + capacity)`` are held; everything at or
past ``base + capacity`` has never been written and is zero by construction, which
lets a scan jump over empty stretches in O(1).

>>> t = ChecksumTable(n_segments=1, initial_windows=8, max_windows=64)
>>> seg = np.zeros(2, np.int32)
>>> t.apply(seg, np.array([3, 5]), np.array([7, 9], np.uint64), np.array([1, 1]))
>>> t.first_open(0, limit=100)
3
>>> t.apply(seg[:1], np.array([3]), np.array([7], np.uint64), np.array([-1]))
>>> t.first_open(0, limit=100), t.first_open(0, limit=4)
(5, 4)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from lowtide.core.errors import AckBehindHead, TableOverflow
from lowtide.core.messages import I32, I64, U64

_FIRST_CHUNK = 64


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class ChecksumTable:
    def __init__(self, n_segments: int, initial_windows: int = 1024, max_windows: int = 1 << 20):
        if initial_windows <= 0 or max_windows < initial_windows:
            raise ValueError("need 0 < initial_windows <= max_windows")
        self._cap = _pow2_at_least(initial_windows)
        self._max = max_windows
        self._xor = np.zeros((n_segments, self._cap), np.uint64)
        self._count = np.zeros((n_segments, self._cap), np.int64)
        self._base = np.zeros(n_segments, np.int64)

    @property
    def capacity(self) -> int:
        return self._cap

    def base(self, segment: int) -> int:
        return int(self._base[segment])

    def check(self, segments: I32, windows: I64) -> None:
        """Raise unless every (segment, window) is at or past its base and fits."""
        if len(windows) == 0:
            return
        offset = windows - self._base[segments]
        low = int(offset.min())
        if low < 0:
            i = int(offset.argmin())
            raise AckBehindHead(
                f"ack for window {int(windows[i])} of segment {int(segments[i])}, "
                f"but that segment is complete up to window {int(self._base[segments[i]])}"
            )
        high = int(offset.max())
        if high >= self._max:
            i = int(offset.argmax())
            raise TableOverflow(
                f"ack for window {int(windows[i])} of segment {int(segments[i])} is {high} "
                f"windows past the oldest open window (max_windows={self._max})"
            )

    def apply(self, segments: I32, windows: I64, xors: U64, counts: I64) -> None:
        """XOR and add into the table; call :meth:`check` first for a clean error."""
        if len(windows) == 0:
            return
        self.check(segments, windows)
        span = int((windows - self._base[segments]).max()) + 1
        if span > self._cap:
            self._grow(_pow2_at_least(span))
        col = windows & (self._cap - 1)
        np.bitwise_xor.at(self._xor, (segments, col), xors)
        np.add.at(self._count, (segments, col), counts)

    def first_open(self, segment: int, limit: int) -> int:
        """First window in [base, limit) whose XOR or count is non-zero, else
        ``max(base, limit)``: the segment's min time in windows."""
        base = int(self._base[segment])
        span = min(limit - base, self._cap)
        scanned, chunk = 0, _FIRST_CHUNK
        while scanned < span:
            n = min(chunk, span - scanned)
            hit = self._first_nonzero(segment, base + scanned, n)
            if hit >= 0:
                return base + scanned + hit
            scanned += n
            chunk *= 4
        return max(base, limit)

    def open_windows(self, segment: int, limit: int) -> tuple[I64, U64, I64]:
        """All non-zero windows in [base, limit): (windows, xors, counts)."""
        base = int(self._base[segment])
        n = max(0, min(limit - base, self._cap))
        windows = base + np.arange(n, dtype=np.int64)
        col = windows & (self._cap - 1)
        xors, counts = self._xor[segment, col], self._count[segment, col]
        nz = (xors != 0) | (counts != 0)
        return windows[nz], xors[nz], counts[nz]

    def release(self, segment: int, window: int) -> None:
        """Move the base forward to ``window``, but never past an open window."""
        base = int(self._base[segment])
        if window <= base:
            return
        hit = self._first_nonzero(segment, base, min(window - base, self._cap))
        self._base[segment] = window if hit < 0 else base + hit

    def entries(self) -> tuple[I64, U64, I64, I32]:
        """Every non-zero cell as (windows, xors, counts, segments): a sparse snapshot."""
        seg, col = np.nonzero((self._xor != 0) | (self._count != 0))
        offset = (col - self._base[seg]) & (self._cap - 1)
        windows = self._base[seg] + offset
        return windows, self._xor[seg, col], self._count[seg, col], seg.astype(np.int32)

    def bases(self) -> I64:
        return self._base.copy()

    def load(self, bases: I64, entries: tuple[I64, U64, I64, I32]) -> None:
        """Replace the contents with ``bases`` and sparse ``entries`` (see :meth:`entries`)."""
        windows, xors, counts, segments = entries
        old, self._base = self._base, np.asarray(bases, np.int64).copy()
        try:
            self.check(segments, windows)  # before anything is wiped
        except (AckBehindHead, TableOverflow):
            self._base = old
            raise
        self._xor[:] = 0
        self._count[:] = 0
        self.apply(segments, windows, xors, counts)

    def _first_nonzero(self, segment: int, start: int, n: int) -> int:
        """Index of the first non-zero among n windows from ``start``, or -1."""
        lo = start & (self._cap - 1)
        hi = lo + n
        if hi <= self._cap:
            x, c = self._xor[segment, lo:hi], self._count[segment, lo:hi]
        else:
            wrap = hi - self._cap
            x = np.concatenate((self._xor[segment, lo:], self._xor[segment, :wrap]))
            c = np.concatenate((self._count[segment, lo:], self._count[segment, :wrap]))
        nz: npt.NDArray[np.bool_] = (x != 0) | (c != 0)
        return int(nz.argmax()) if nz.any() else -1

    def _grow(self, new_cap: int) -> None:
        old_cap = self._cap
        n_seg = len(self._base)
        windows = self._base[:, None] + np.arange(old_cap, dtype=np.int64)[None, :]
        rows = np.arange(n_seg)[:, None]
        xor = np.zeros((n_seg, new_cap), np.uint64)
        count = np.zeros((n_seg, new_cap), np.int64)
        xor[rows, windows & (new_cap - 1)] = self._xor[rows, windows & (old_cap - 1)]
        count[rows, windows & (new_cap - 1)] = self._count[rows, windows & (old_cap - 1)]
        self._xor, self._count, self._cap = xor, count, new_cap
