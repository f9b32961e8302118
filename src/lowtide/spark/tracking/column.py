"""The per-row tracking column and the vectorised ack arithmetic of the Spark layer.

Every tracked row carries ONE int64 column, ``lt_track``: its slot modulo 2**32 in the
high 32 bits and its 32-bit ack id in the low 32 (one column instead of two: each
extra 8 bytes per row cost a 16-byte-row pipeline 2-3% of its throughput, mostly in
the shuffles). The tracker gets, per (segment, time), the XOR of the ids and the row
count. Full slots come back by unwrapping against a reference slot, any slot within
2**31 slots of every row's (248 days at ``delta_ms=10``): a task's wall clock, or a
batch's timestamp. Sources refuse rows more than 2**30 slots from their clock
(:func:`pack`), later tasks rows more than 1.5 * 2**30 from theirs (:func:`unwrap`).

Nothing in this module loops over rows in Python. A micro-batch spans few slots, so
the ids of a batch are XOR-reduced per time in one compiled pass into a table indexed
by each row's offset from the earliest slot (:mod:`.kernels`). A batch spanning more
(a backlog) is grouped in numpy: by a radix sort of 16-bit time offsets, or by sorting
the times themselves (:class:`TimeGroups`), then ``np.bitwise_xor.reduceat`` over runs
of equal times.

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

from lowtide.core.acks import splitmix64
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
U32 = npt.NDArray[np.uint32]


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


#: a plan's reference slot is a multiple of this (2**24 slots: 47 hours at delta_ms=10)
PLAN_REFERENCE_SLOTS = 1 << 24


def plan_reference_slot(grid: TimeGrid) -> int:
    """The reference slot of an unwrap planned as a Spark expression: the wall-clock
    slot rounded to the nearest multiple of :data:`PLAN_REFERENCE_SLOTS`. The literal
    is part of the code Spark generates for the stage; rounded, every query planned
    within those hours has the same code, which Spark's code cache compiles once and
    the JIT keeps compiled (each new query otherwise compiles its stages again). It is
    at most 2**23 slots from the clock, 0.5% of HELD_RANGE.

    >>> g = TimeGrid(10)
    >>> ref = plan_reference_slot(g)
    >>> ref % PLAN_REFERENCE_SLOTS, abs(ref - reference_slot(g)) <= PLAN_REFERENCE_SLOTS // 2
    (0, True)
    """
    half = PLAN_REFERENCE_SLOTS // 2
    return (reference_slot(grid) + half) // PLAN_REFERENCE_SLOTS * PLAN_REFERENCE_SLOTS


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
    receive-acks and its children's send-acks share their rows' times).

    A micro-batch spans few slots, so each row gets a small code (its offset from the
    earliest slot, 8 or 16 bits) and numpy's stable sort of those codes is a radix
    sort: no comparison sort, whatever the order of the rows (they come shuffled)."""

    times: I64  # distinct times present; ascending, except unwrapped ones (of_packed)
    counts: I64  # rows per time
    starts: npt.NDArray[np.intp]  # where each time's run starts, in grouped order
    order: npt.NDArray[np.intp] | None  # the permutation that groups rows; None: as they are

    @classmethod
    def of(cls, times: I64) -> TimeGroups:
        t = np.asarray(times, np.int64)
        if len(t) == 0:
            return cls(t, np.empty(0, np.int64), np.empty(0, np.intp), None)
        lo, hi = int(t.min()), int(t.max())
        if hi - lo >= 1 << 16:  # rows from far apart (a backlog): sort the times themselves
            order = np.argsort(t, kind="stable")
            st = t[order]
            starts = np.flatnonzero(np.concatenate(([True], st[1:] != st[:-1])))
            counts = np.diff(np.append(starts, len(t))).astype(np.int64)
            return cls(st[starts], counts, starts, order)
        codes = (t - lo).astype(np.uint8 if hi - lo < 1 << 8 else np.uint16)
        order = None if _ascending(codes) else np.argsort(codes, kind="stable")
        grouped = codes if order is None else codes[order]
        if hi - lo < 1 << 10:  # where each code's run starts, the last entry the end
            bounds = np.searchsorted(grouped, np.arange(hi - lo + 2))
            present = np.flatnonzero(np.diff(bounds))
            starts = bounds[present]
        else:
            starts = np.flatnonzero(np.concatenate(([True], grouped[1:] != grouped[:-1])))
            present = grouped[starts]
        counts = np.diff(np.append(starts, len(t))).astype(np.int64)
        return cls(lo + present.astype(np.int64), counts, starts.astype(np.intp), order)

    @classmethod
    def of_packed(cls, packed: I64, ref_slot: int) -> TimeGroups:
        """Group rows by the slots in their tracking column: by the wrapped slots (no
        per-row unwrapping), then unwrap the distinct ones."""
        g = cls.of(np.asarray(packed, np.int64) >> ID_BITS)
        return replace(g, times=unwrap(g.times, ref_slot))

    def xor(self, values: U64) -> U64:
        """XOR of ``values`` (one per row, in the rows' order) per time."""
        v = np.asarray(values)
        if len(v) == 0:
            return np.empty(0, v.dtype)
        if self.order is not None:
            v = v[self.order]
        out: U64 = np.bitwise_xor.reduceat(v, self.starts)
        return out

    def sums(self, values: npt.NDArray[Any]) -> I64:
        """Sum of ``values`` (one per row) per time."""
        v = np.asarray(values, np.int64)
        if self.order is not None:
            v = v[self.order]
        out: I64 = np.add.reduceat(v, self.starts) if len(v) else np.empty(0, np.int64)
        return out


_NO_VALUES = np.empty(0, np.uint64)
_KEEP_ALL = np.empty(0, np.bool_)


def _kernels() -> Any:
    """The compiled kernels, imported on first use: numba's import and its cache's
    load (about 0.25 s) are paid by the task workers (lowtide's worker daemon imports
    the kernels before it forks them), not by a driver that only plans a pipeline."""
    from lowtide.spark.tracking import kernels

    return kernels


def _dense(keys: I64, shift: int) -> tuple[int, int] | None:
    """(first key, span) of non-empty ``keys >> shift`` (unsigned) where the kernels'
    dense table covers them, else None."""
    k = _kernels()
    lo, hi = k.key_span(keys, shift)
    return (lo, hi - lo + 1) if 0 <= hi - lo < k.DENSE_SPAN else None


_FMIX1 = np.uint32(0x85EBCA6B)
_FMIX2 = np.uint32(0xC2B2AE35)
_GOLDEN32 = np.uint32(0x9E3779B9)


def operator_salt(op_id: int) -> int:
    """An operator's 32-bit salt for :func:`child_ids`."""
    return int(splitmix64(np.array([op_id], np.uint64))[0] & ID_MASK)


def child_ids(parents: U32, salt: int, index: npt.NDArray[np.integer] | None = None) -> U32:
    """Children's 32-bit ack ids, a pure function of (parent id, operator salt, child
    index) (rule 5): murmur3's 32-bit finaliser over 32-bit words, a third of the work
    of two 64-bit splitmix rounds. It is a bijection, so the children of distinct
    parents (one child each: a map, a filter) are distinct; never 0.

    >>> p = np.array([1, 2, 3], np.uint32)
    >>> len(set(child_ids(p, 7).tolist())), bool((child_ids(p, 7) == child_ids(p, 8)).any())
    (3, False)
    """
    x = np.bitwise_xor(parents, np.uint32(salt), dtype=np.uint32)
    if index is not None:
        x += np.asarray(index).astype(np.uint32) * _GOLDEN32
    x ^= x >> np.uint32(16)
    x *= _FMIX1
    x ^= x >> np.uint32(13)
    x *= _FMIX2
    x ^= x >> np.uint32(16)
    out: U32 = np.maximum(x, np.uint32(1), out=x)
    return out


def track_children(
    acc: AckAccumulator,
    segments: tuple[int, int],
    packed: I64,
    ref_slot: int,
    salt: int,
    children: npt.NDArray[Any] | None = None,
) -> I64:
    """Record one input batch of a tracked operator in ``acc``: its rows' receipts out
    of ``segments[0]`` and their children's send-acks into ``segments[1]``; return the
    children's tracking column (their parents' slots, :func:`child_ids`).

    ``children``: None, one child per row (a map); a boolean mask, the rows kept (a
    filter); or indices, the parent row of each child (a flat_map)."""
    p = np.ascontiguousarray(packed, np.int64)
    dense = _dense(p, ID_BITS) if len(p) else None
    if dense is not None and (children is None or children.dtype == np.bool_):
        keep = _KEEP_ALL if children is None else np.ascontiguousarray(children, np.bool_)
        if children is not None and len(keep) != len(p):
            raise ValueError(f"a filter's mask has {len(keep)} rows, its input {len(p)}")
        c_packed, recv, sent, parents, kids = _kernels().children(p, np.uint64(salt), keep, *dense)
        present = np.flatnonzero(parents)
        times = unwrap(dense[0] + present, ref_slot)
        acc.add_reduced(segments[0], times, recv[present], -parents[present])
        some = kids[present] > 0
        acc.add_reduced(segments[1], times[some], sent[present][some], kids[present][some])
        out: I64 = c_packed
        return out
    u = as_u64(p)
    ids = u.astype(np.uint32)  # the low 32 bits
    groups = TimeGroups.of_packed(p, ref_slot)
    if children is None or children.dtype == np.bool_:
        child = child_ids(ids, salt)
        sent = child if children is None else np.where(children, child, np.uint32(0))
        # receipts' XOR in the high half, children's in the low: one grouping pass
        both = groups.xor((ids.astype(np.uint64) << np.uint64(ID_BITS)) | sent)
        kept = groups.counts if children is None else groups.sums(children)
        acc.add_reduced(segments[0], groups.times, both >> np.uint64(ID_BITS), -groups.counts)
        some = kept > 0
        acc.add_reduced(segments[1], groups.times[some], both[some] & ID_MASK, kept[some])
        c_packed: I64 = ((u & SLOT_MASK) | child).view(np.int64)
        return c_packed if children is None else c_packed[children]
    child = child_ids(ids[children], salt, child_index(children))
    c_packed = ((u[children] & SLOT_MASK) | child).view(np.int64)
    acc.add_reduced(segments[0], groups.times, groups.xor(ids), -groups.counts)
    c_groups = TimeGroups.of_packed(c_packed, ref_slot)
    acc.add_reduced(segments[1], c_groups.times, c_groups.xor(child), c_groups.counts)
    return c_packed


def _ascending(codes: npt.NDArray[np.unsignedinteger[Any]]) -> bool:
    """Whether ``codes`` never go down; rows after a shuffle rarely do, and a look at
    the first few tells most of those apart without a pass over all."""
    head = codes[:16].astype(np.int32)
    if len(head) > 1 and bool((head[1:] < head[:-1]).any()):
        return False
    return bool((codes[1:] >= codes[:-1]).all())


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

    # rows sent and received so far, summed when asked (only traces ask)
    rows_sent = property(lambda self: int(sum(int(c[c > 0].sum()) for c in self._count)))
    rows_received = property(lambda self: -int(sum(int(c[c < 0].sum()) for c in self._count)))

    def add(self, segment: int, times: I64, acks: U64, sign: int) -> None:
        """Send (sign=+1) or receive (sign=-1) the rows ``(times, acks)`` in ``segment``."""
        t = np.ascontiguousarray(times, np.int64)
        a = np.ascontiguousarray(acks, np.uint64)
        if len(a) != len(t):
            raise ValueError(f"{len(t)} times and {len(a)} acks: one ack per row")
        if len(t) and not self._add_dense(segment, t, 0, a, sign, None):
            self.add_grouped(segment, TimeGroups.of(t), a, sign)

    def add_packed(self, segment: int, packed: I64, ref_slot: int, sign: int) -> None:
        """Like :meth:`add`, for rows given by their tracking column."""
        p = np.ascontiguousarray(packed, np.int64)
        if len(p) and not self._add_dense(segment, p, ID_BITS, _NO_VALUES, sign, ref_slot):
            self.add_grouped(segment, TimeGroups.of_packed(p, ref_slot), ack_ids(p), sign)

    def _add_dense(self, segment: int, keys: I64, shift: int, values: U64, sign: int,
                   ref_slot: int | None) -> bool:
        """Rows summed per slot in one compiled pass (:func:`kernels.xor_sums`), if the
        kernels' table covers their span; ``ref_slot``: the keys are a tracking column,
        whose wrapped slots are unwrapped against it."""
        dense = _dense(keys, shift)
        if dense is None:
            return False
        xors, counts = _kernels().xor_sums(keys, shift, values, *dense)
        present = np.flatnonzero(counts)
        times = dense[0] + present
        self.add_reduced(segment, times if ref_slot is None else unwrap(times, ref_slot),
                         xors[present], counts[present] * sign)
        return True

    def add_grouped(self, segment: int, groups: TimeGroups, acks: U64, sign: int) -> None:
        """Like :meth:`add`, for rows whose times are already grouped."""
        self.add_reduced(segment, groups.times, groups.xor(acks), groups.counts * sign)

    def add_reduced(self, segment: int, times: I64, xors: U64, counts: I64) -> None:
        """Already reduced entries (e.g. from a Spark ``bit_xor`` aggregate); counts
        are positive for sends, negative for receipts."""
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
