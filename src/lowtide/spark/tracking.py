"""The per-row tracking column and the vectorised ack arithmetic of the Spark layer.

Every tracked row carries ONE int64 column, ``lt_track``: its slot modulo 2**32 in the
high 32 bits and its 32-bit ack id in the low 32 (one column instead of two: each
extra 8 bytes per row cost a 16-byte-row pipeline 2-3% of its throughput, mostly in
the shuffles). The tracker gets, per (segment, time), the XOR of the ids and the row
count. Full slots come back by unwrapping against a reference slot, any slot within
2**31 slots of every row's (248 days at ``delta_ms=10``): a task's wall clock, or a
batch's timestamp. Sources refuse rows more than 2**30 slots from their clock
(:func:`pack`), later tasks rows more than 1.5 * 2**30 from theirs (:func:`unwrap`).

Nothing in this module loops over rows in Python: ids are XOR-reduced per time with
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
>>> ref = 180_000_000_000  # a slot of 2027 at delta_ms=10
>>> p = pack(np.array([ref - 7, ref + 3], np.int64), np.array([2**40 + 9, 5], np.uint64), ref)
>>> slots_of(p, ref + 1_000).tolist(), ack_ids(p).tolist()
([179999999993, 180000000003], [9, 5])
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from lowtide.core.local import merge_acks
from lowtide.core.messages import AckBatch
from lowtide.core.time import TimeGrid
from lowtide.service.clock import wall_ms

TRACK_COL = "lt_track"
TRACKING_COLS = (TRACK_COL,)
# what a sink writes with keep_tracking_columns: the row's full slot and its ack id
TIME_COL = "lt_time"
ACK_COL = "lt_ack"

ID_BITS = 32
ID_MASK = np.uint64((1 << ID_BITS) - 1)
SLOT_MASK = ~ID_MASK
WRAP_SLOTS = 1 << ID_BITS  # lt_track holds slots modulo this
UNWRAP_RANGE = WRAP_SLOTS // 2  # unwrapping picks the slot within this of the reference
# sources take rows within PACK_RANGE of their clock (124 days at delta_ms=10); tasks
# after them, with later clocks, refuse rows past HELD_RANGE of theirs: a row is
# unwrapped right while its task's clock is within UNWRAP_RANGE of it
PACK_RANGE = UNWRAP_RANGE // 2
HELD_RANGE = 3 * UNWRAP_RANGE // 4

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


def reference_slot(grid: TimeGrid) -> int:
    """This process's wall-clock slot: the reference a task unwraps its rows' slots
    against (rows in flight are labelled within days of it, far inside the ranges)."""
    return grid.slot_of(wall_ms())


def _check_range(slots: I64, ref_slot: int, limit: int, fix: str) -> None:
    if len(slots) == 0:
        return
    lo, hi = int(slots.min()), int(slots.max())
    bad = lo if ref_slot - lo >= hi - ref_slot else hi
    if abs(bad - ref_slot) >= limit:
        raise ValueError(
            f"a row of slot {bad} is {abs(bad - ref_slot):,} slots from this task's clock "
            f"(slot {ref_slot}); the tracking column holds slots modulo 2**{ID_BITS}, and "
            f"this part of lowtide takes rows within {limit:,} slots of its clock "
            f"({limit * 10 / 86_400_000:.0f} days at delta_ms=10): {fix}")


def _ids(ids: U64) -> U64:
    """Low 32 bits, never 0 (an id of 0 would vanish from the XORs)."""
    out: U64 = np.maximum(np.asarray(ids, np.uint64) & ID_MASK, np.uint64(1))
    return out


def pack(slots: I64, ids: U64, ref_slot: int) -> I64:
    """The tracking column of rows labelled ``slots`` with ack values ``ids`` (their
    low 32 bits are kept). A source packs against its clock and refuses rows more than
    PACK_RANGE from it, so that later tasks, with later clocks, still unwrap them."""
    t = np.asarray(slots, np.int64)
    _check_range(t, ref_slot, PACK_RANGE, "label rows with the wall clock")
    out: I64 = ((t.astype(np.uint64) << np.uint64(ID_BITS)) | _ids(ids)).view(np.int64)
    return out


def attach(batch: Any, packed: I64) -> Any:
    """``batch`` (a pyarrow RecordBatch) with the tracking column appended."""
    import pyarrow as pa

    return batch.append_column(TRACK_COL, pa.array(np.asarray(packed, np.int64), pa.int64()))


def ack_ids(packed: I64) -> U64:
    """The rows' ack ids (what the tracker XORs)."""
    out: U64 = as_u64(packed) & ID_MASK
    return out


def with_ids(parent_packed: I64, ids: U64) -> I64:
    """Children's tracking column: the parents' slots (rule 5: children inherit their
    parent's time) with new ids."""
    out: I64 = ((as_u64(parent_packed) & SLOT_MASK) | _ids(ids)).view(np.int64)
    return out


def unwrap(wrapped: I64, ref_slot: int) -> I64:
    """Full slots from slots modulo 2**32: the ones in [ref - 2**31, ref + 2**31).
    Refuses results further than HELD_RANGE from ``ref_slot``: that close to the edge
    a row may have been unwrapped to the wrong cycle."""
    base = ref_slot - UNWRAP_RANGE
    out: I64 = base + ((np.asarray(wrapped, np.int64) - base) & np.int64(WRAP_SLOTS - 1))
    _check_range(out, ref_slot, HELD_RANGE,
                 "a row held this long, or clocks this far apart, cannot be tracked")
    return out


def slots_of(packed: I64, ref_slot: int) -> I64:
    """The rows' full slots."""
    return unwrap(np.asarray(packed, np.int64) >> ID_BITS, ref_slot)


@dataclass(frozen=True)
class TimeGroups:
    """Rows grouped by time, once, for XOR-reducing any per-row values (a map's
    receive-acks and its children's send-acks share their rows' times)."""

    times: I64  # distinct; ascending, except unwrapped ones around a slot = 2**31 mod 2**32
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

    @classmethod
    def of_packed(cls, packed: I64, ref_slot: int) -> TimeGroups:
        """Group rows by the slots in their tracking column: by the wrapped slots (no
        per-row unwrapping), then unwrap the distinct ones."""
        g = cls.of(np.asarray(packed, np.int64) >> ID_BITS)
        return replace(g, times=unwrap(g.times, ref_slot))

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
        grouped: npt.NDArray[np.intp] = np.arange(len(t)) + first
        return grouped
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

    def add_packed(self, segment: int, packed: I64, ref_slot: int, sign: int) -> None:
        """Like :meth:`add`, for rows given by their tracking column."""
        if len(packed) == 0:
            return
        self.add_grouped(segment, TimeGroups.of_packed(packed, ref_slot), ack_ids(packed), sign)

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
