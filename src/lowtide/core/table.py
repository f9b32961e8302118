"""Checksum table: per segment, a ring of (XOR, count) by tracking window.

All segments share one 2-D ring (segment x capacity); window ``w`` lives in column
``w & (capacity - 1)``. Each segment keeps a *base*: the oldest window it may still
receive acks for. Windows in ``[base, base + capacity)`` are held; everything at or
past ``base + capacity`` has never been written and is zero by construction, which
lets a scan jump over empty stretches in O(1). Each segment also keeps a *clean mark*:
every window from its base up to the mark is known to be zero. A scan starts at the
mark and moves it up to what it found; an ack below the mark moves it down. So a scan
only reads the windows acks touched since the last one, however far the base lags
(a shard keeps complete windows until the aggregator releases them).

A shard's table holds only the windows it owns (``owned_every`` = number of shards,
``owned_index`` = the shard): window ``w`` with ``w % every == index`` is stored at the
*compressed* index ``w // every``, so the ring, the scans and the releases of a shard
are ``every`` times smaller than a table over all windows. The mapping stays inside the
table: every method takes and returns real windows. A scan that finds nothing answers
the first *owned* window at or after ``max(base, limit)``; a release to ``w`` drops the
owned windows below ``w``; an ack for a window the table does not own is refused.

>>> s = ChecksumTable(n_segments=1, initial_windows=8, owned_every=2, owned_index=1)
>>> s.apply(np.zeros(1, np.int32), np.array([5]), np.array([7], np.uint64), np.array([1]))
>>> s.first_open(0, limit=100), s.first_open(0, limit=4), s.first_open(0, limit=5)
(5, 5, 5)
>>> s.release(0, 4); s.base(0)        # owned windows 1 and 3 dropped
5

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

from lowtide.core.errors import AckBehindHead, ProtocolError, TableOverflow
from lowtide.core.messages import I32, I64, U64

_FIRST_CHUNK = 64


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class ChecksumTable:
    def __init__(
        self,
        n_segments: int,
        initial_windows: int = 1024,
        max_windows: int = 1 << 20,
        *,
        owned_every: int = 1,
        owned_index: int = 0,
    ):
        if initial_windows <= 0 or max_windows < initial_windows:
            raise ValueError("need 0 < initial_windows <= max_windows")
        if owned_every <= 0 or not 0 <= owned_index < owned_every:
            raise ValueError("need 0 <= owned_index < owned_every")
        self._cap = _pow2_at_least(initial_windows)
        self._max = max_windows
        self._every = owned_every
        self._index = owned_index
        self._xor = np.zeros((n_segments, self._cap), np.uint64)
        self._count = np.zeros((n_segments, self._cap), np.int64)
        self._base = np.zeros(n_segments, np.int64)  # compressed windows
        # [base, max(base, clean)) is all zero (compressed windows)
        self._clean = np.zeros(n_segments, np.int64)
        #: counts every change of contents or bases (MinTimes steps only after one)
        self.version = 0

    # ------------------------------------------------- real <-> compressed windows
    def _up(self, window: int) -> int:
        """Compressed index of the first owned window at or after ``window``."""
        return -((self._index - window) // self._every)

    def _real(self, compressed: int) -> int:
        return compressed * self._every + self._index

    def _compress(self, segments: I32, windows: I64) -> I64:
        """Compressed indices of owned windows; refuses a window the table does not own."""
        if self._every == 1:
            return windows
        q, r = np.divmod(windows, self._every)
        if (r != self._index).any():
            i = int(np.argmax(r != self._index))
            raise ProtocolError(
                f"ack for window {int(windows[i])} of segment {int(segments[i])}, which this "
                f"table does not hold (it holds windows w with w % {self._every} == "
                f"{self._index})"
            )
        return q

    @property
    def capacity(self) -> int:
        return self._cap

    def base(self, segment: int) -> int:
        """The oldest window the segment may still receive acks for (an owned window)."""
        return self._real(int(self._base[segment]))

    def check(
        self, segments: I32, windows: I64, bounds: tuple[int, int] | None = None
    ) -> I64:
        """Raise unless every (segment, window) is owned, at or past its base and fits;
        returns the rows' compressed windows, which :meth:`apply` may reuse.
        ``bounds``: the rows' (min, max) window, if the caller knows them already."""
        compressed = self._compress(segments, windows)
        if len(windows):
            self._check_offsets(segments, windows, compressed, self._cbounds(windows, bounds))
        return compressed

    def _cbounds(self, windows: I64, bounds: tuple[int, int] | None) -> tuple[int, int]:
        """(min, max) compressed window of owned rows."""
        lo, hi = bounds if bounds is not None else (int(windows.min()), int(windows.max()))
        return lo // self._every, hi // self._every

    def _check_offsets(
        self, segments: I32, windows: I64, compressed: I64, cbounds: tuple[int, int]
    ) -> None:
        """Raises like :meth:`check` (ownership aside)."""
        clo, chi = cbounds
        if clo >= int(self._base.max()) and chi - int(self._base.min()) < self._max:
            return  # every row is at or past every base, and fits: no per-row check
        offset = compressed - self._base[segments]
        low = int(offset.min())
        if low < 0:
            i = int(offset.argmin())
            raise AckBehindHead(
                f"ack for window {int(windows[i])} of segment {int(segments[i])}, "
                f"but that segment is complete up to window {self.base(int(segments[i]))}"
            )
        high = int(offset.max())
        if high >= self._max:
            i = int(offset.argmax())
            raise TableOverflow(
                f"ack for window {int(windows[i])} of segment {int(segments[i])} is {high} "
                f"held windows past the oldest open window (max_windows={self._max})"
            )

    def apply(
        self,
        segments: I32,
        windows: I64,
        xors: U64,
        counts: I64,
        *,
        checked: I64 | None = None,
        bounds: tuple[int, int] | None = None,
    ) -> None:
        """XOR and add into the table; raises like :meth:`check`, with nothing changed.
        ``checked``: what :meth:`check` returned for these very rows, with no release
        in between (saves validating twice); ``bounds`` as for :meth:`check`."""
        if len(windows) == 0:
            return
        cbounds = self._cbounds(windows, bounds)
        if checked is None:
            compressed = self._compress(segments, windows)
            self._check_offsets(segments, windows, compressed, cbounds)
        else:
            compressed = checked
        clo, chi = cbounds
        if chi - int(self._base.min()) >= self._cap:  # maybe too wide: the exact span
            span = int((compressed - self._base[segments]).max()) + 1
            if span > self._cap:
                self._grow(_pow2_at_least(span))
        # One flat index into the (segment x capacity) ring: 1-D ufunc.at is several
        # times faster than the 2-D form with a tuple of index arrays.
        flat = (compressed & (self._cap - 1)) + segments.astype(np.int64) * self._cap
        # ufunc.at leaves its fast path for unaligned operands (columns decoded straight
        # from a wire buffer are): 20-30x slower. Copying them costs far less.
        xors = np.require(xors, np.uint64, "A")
        counts = np.require(counts, np.int64, "A")
        np.bitwise_xor.at(self._xor.reshape(-1), flat, xors)
        np.add.at(self._count.reshape(-1), flat, counts)
        if clo < int(self._clean.max()):  # some rows may be below a clean mark
            np.minimum.at(self._clean, segments, np.require(compressed, np.int64, "A"))
        self.version += 1

    def first_open(self, segment: int, limit: int) -> int:
        """First window in [base, limit) whose XOR or count is non-zero, else the first
        owned window at or after ``max(base, limit)``: the segment's min time in windows."""
        base = int(self._base[segment])
        climit = self._up(limit)
        start = max(base, int(self._clean[segment]))
        span = min(climit, base + self._cap) - start  # past base + cap: never written
        scanned, chunk = 0, _FIRST_CHUNK
        while scanned < span:
            n = min(chunk, span - scanned)
            hit = self._first_nonzero(segment, start + scanned, n)
            if hit >= 0:
                self._clean[segment] = start + scanned + hit
                return self._real(start + scanned + hit)
            scanned += n
            chunk *= 4
        if climit > start:
            self._clean[segment] = climit
        return self._real(max(base, climit))

    def open_windows(self, segment: int, limit: int) -> tuple[I64, U64, I64]:
        """All non-zero windows in [base, limit): (windows, xors, counts)."""
        base = int(self._base[segment])
        n = max(0, min(self._up(limit) - base, self._cap))
        windows = base + np.arange(n, dtype=np.int64)
        col = windows & (self._cap - 1)
        xors, counts = self._xor[segment, col], self._count[segment, col]
        nz = (xors != 0) | (counts != 0)
        return windows[nz] * self._every + self._index, xors[nz], counts[nz]

    def release(self, segment: int, window: int) -> None:
        """Drop the windows below ``window``, but never past an open window."""
        base = int(self._base[segment])
        target = self._up(window)
        if target <= base:
            return
        start = max(base, int(self._clean[segment]))
        span = min(target, base + self._cap) - start
        hit = self._first_nonzero(segment, start, span) if span > 0 else -1
        self._base[segment] = target if hit < 0 else start + hit
        self.version += 1

    def add_rows(self, bases: list[int]) -> None:
        """Append empty rows (attached segments, rule 16), each starting at its base
        window: acks below it are refused as behind the head."""
        n = len(bases)
        self._xor = np.vstack((self._xor, np.zeros((n, self._cap), np.uint64)))
        self._count = np.vstack((self._count, np.zeros((n, self._cap), np.int64)))
        new = np.array([self._up(b) for b in bases], np.int64)
        self._base = np.concatenate((self._base, new))
        self._clean = np.concatenate((self._clean, new))
        self.version += 1

    def clear(self, segment: int) -> None:
        """Forget every window of a detached segment's row (rule 16)."""
        self._xor[segment] = 0
        self._count[segment] = 0
        self.version += 1

    def entries(self) -> tuple[I64, U64, I64, I32]:
        """Every non-zero cell as (windows, xors, counts, segments): a sparse snapshot."""
        seg, col = np.nonzero((self._xor != 0) | (self._count != 0))
        offset = (col - self._base[seg]) & (self._cap - 1)
        windows = (self._base[seg] + offset) * self._every + self._index
        return windows, self._xor[seg, col], self._count[seg, col], seg.astype(np.int32)

    def bases(self) -> I64:
        """Every segment's :meth:`base` (real windows)."""
        return self._base * self._every + self._index

    def load(self, bases: I64, entries: tuple[I64, U64, I64, I32]) -> None:
        """Replace the contents with ``bases`` and sparse ``entries`` (see :meth:`entries`)."""
        windows, xors, counts, segments = entries
        real = np.asarray(bases, np.int64)
        old, self._base = self._base, -((self._index - real) // self._every)
        try:
            self.check(segments, windows)  # before anything is wiped
        except ProtocolError:
            self._base = old
            raise
        self._xor[:] = 0
        self._count[:] = 0
        self._clean = self._base.copy()
        self.version += 1
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
