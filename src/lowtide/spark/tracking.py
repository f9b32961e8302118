"""Per-row tracking columns and the vectorised ack arithmetic of the Spark layer.

Every tracked row carries two columns: ``lt_time`` (its slot, int64) and ``lt_ack``
(its 64-bit ack value, stored as int64 in Spark and reinterpreted as uint64 here).
Nothing in this module loops over rows in Python: acks are XOR-reduced per time with
``np.bitwise_xor.reduceat`` over runs of equal times. Rows a source emits are grouped
by time already (no sort); rows after a repartition are shuffled, but a micro-batch
spans few slots, so a radix sort of 16-bit time offsets groups them
(:class:`TimeGroups`).

>>> import numpy as np
>>> t = np.array([5, 5, 6, 5], np.int64); a = np.array([1, 2, 4, 8], np.uint64)
>>> times, xors, counts = xor_by_time(t, a)
>>> times.tolist(), xors.tolist(), counts.tolist()
([5, 6], [11, 4], [3, 1])
>>> child_index(np.array([0, 0, 2, 2, 2, 3])).tolist()
[0, 1, 0, 1, 2, 0]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lowtide.core.local import merge_acks
from lowtide.core.messages import AckBatch

TIME_COL = "lt_time"
ACK_COL = "lt_ack"
TRACKING_COLS = (TIME_COL, ACK_COL)

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]


def as_u64(values: npt.NDArray[np.int64]) -> U64:
    """Reinterpret Spark's int64 ack column as uint64 (no copy)."""
    out: U64 = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64)
    return out


def as_i64(values: U64) -> I64:
    """Reinterpret uint64 ack values as int64 for a Spark LongType column (no copy)."""
    out: I64 = np.ascontiguousarray(values, dtype=np.uint64).view(np.int64)
    return out


@dataclass(frozen=True)
class TimeGroups:
    """Rows grouped by time, once, for XOR-reducing any per-row values (a map's
    receive-acks and its children's send-acks share their rows' times)."""

    times: I64  # distinct, ascending
    counts: I64  # rows per time
    starts: npt.NDArray[np.intp]  # where each time's run starts, in grouped order
    order: npt.NDArray[np.intp] | None  # the permutation that groups rows; None: as they are

    @classmethod
    def of(cls, times: I64) -> TimeGroups:
        t = np.asarray(times, np.int64)
        if len(t) == 0:
            return cls(t, np.empty(0, np.int64), np.empty(0, np.intp), None)
        order = None
        if not bool((t[1:] >= t[:-1]).all()):
            order = _grouping_order(t)
            t = t[order]
        starts = np.flatnonzero(np.r_[True, t[1:] != t[:-1]])
        counts = np.diff(np.append(starts, len(t))).astype(np.int64)
        return cls(t[starts], counts, starts, order)

    def xor(self, values: U64) -> U64:
        """XOR of ``values`` (one per row, in the rows' order) per time."""
        v = np.asarray(values, np.uint64)
        if len(v) == 0:
            return np.empty(0, np.uint64)
        if self.order is not None:
            v = v[self.order]
        out: U64 = np.bitwise_xor.reduceat(v, self.starts)
        return out


def _grouping_order(t: I64) -> npt.NDArray[np.intp]:
    """A stable permutation sorting ``t``. Shuffled rows of a micro-batch span few slots:
    sort 16-bit offsets (numpy's stable sort is a radix sort for them), else run ends
    (rows grouped by time in no particular order), else the times themselves."""
    lo, hi = int(t.min()), int(t.max())
    if hi - lo < 1 << 16:
        out: npt.NDArray[np.intp] = np.argsort((t - lo).astype(np.uint16), kind="stable")
        return out
    ends = np.flatnonzero(t[1:] != t[:-1]) + 1
    if 8 * len(ends) < len(t):  # few runs: order the runs, not the rows
        starts = np.concatenate(([0], ends))
        lengths = np.diff(np.append(starts, len(t)))
        by_run = np.argsort(t[starts], kind="stable")
        first = np.repeat(starts[by_run] - np.cumsum(lengths[by_run]) + lengths[by_run],
                          lengths[by_run])
        return np.arange(len(t)) + first
    return np.argsort(t, kind="stable")


def xor_by_time(times: I64, acks: U64) -> tuple[I64, U64, I64]:
    """(distinct times ascending, XOR of acks per time, rows per time)."""
    g = TimeGroups.of(times)
    return g.times, g.xor(acks), g.counts


def child_index(parents: npt.NDArray[np.integer]) -> U64:
    """Position of each child among the children of its parent.

    ``parents[i]`` is the input row that output row ``i`` came from. Fast path when
    children of one parent are contiguous (the usual flatMap layout)."""
    p = np.asarray(parents, np.int64)
    m = len(p)
    if m == 0:
        return np.empty(0, np.uint64)
    pos = np.arange(m, dtype=np.int64)
    if bool((p[1:] >= p[:-1]).all()):
        first = np.where(np.concatenate(([True], p[1:] != p[:-1])), pos, 0)
        out: U64 = (pos - np.maximum.accumulate(first)).astype(np.uint64)
        return out
    order = np.argsort(p, kind="stable")
    sp = p[order]
    first = np.where(np.concatenate(([True], sp[1:] != sp[:-1])), pos, 0)
    rank = pos - np.maximum.accumulate(first)
    res = np.empty(m, np.uint64)
    res[order] = rank.astype(np.uint64)
    return res


class AckAccumulator:
    """Collects one task's acks as small per-time pieces; :meth:`build` merges them
    into one :class:`AckBatch` (children and receives, any order: the batch is applied
    atomically)."""

    def __init__(self) -> None:
        self._seg: list[npt.NDArray[np.int32]] = []
        self._time: list[I64] = []
        self._xor: list[U64] = []
        self._count: list[I64] = []
        self.rows_sent = 0
        self.rows_received = 0

    def add(self, segment: int, times: I64, acks: U64, sign: int) -> None:
        """Send (sign=+1) or receive (sign=-1) the rows ``(times, acks)`` in ``segment``."""
        if len(times) == 0:
            return
        self.add_grouped(segment, TimeGroups.of(times), acks, sign)

    def add_grouped(self, segment: int, groups: TimeGroups, acks: U64, sign: int) -> None:
        """Like :meth:`add`, for rows whose times are already grouped."""
        self.add_reduced(segment, groups.times, groups.xor(acks), groups.counts * sign)
        rows = int(groups.counts.sum())
        if sign > 0:
            self.rows_sent += rows
        else:
            self.rows_received += rows

    def add_reduced(self, segment: int, times: I64, xors: U64, counts: I64) -> None:
        """Already reduced entries (e.g. from a Spark ``bit_xor`` aggregate)."""
        if len(times) == 0:
            return
        self._seg.append(np.full(len(times), segment, np.int32))
        self._time.append(np.asarray(times, np.int64))
        self._xor.append(np.asarray(xors, np.uint64))
        self._count.append(np.asarray(counts, np.int64))

    def __len__(self) -> int:
        return sum(len(s) for s in self._seg)

    def build(self, window_slots: int) -> AckBatch:
        if not self._seg:
            return AckBatch.empty()
        batch = AckBatch(
            np.concatenate(self._seg),
            np.concatenate(self._time),
            np.concatenate(self._xor),
            np.concatenate(self._count),
        )
        return merge_acks(batch, window_slots)
