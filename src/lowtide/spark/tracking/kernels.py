"""Compiled one-pass kernels of the tracking column (numba).

A tracked task's ack arithmetic per Arrow batch is: group the rows by time, XOR their
ids per time, count them, and for a map or filter derive each child's id. In numpy
that is a dozen passes over temporary arrays (a radix sort of the shuffled rows' time
codes, gathers, the hash's rounds); here it is one pass that reads each row's tracking
column once and keeps the per-time sums in a small dense table indexed by the row's
offset from the batch's earliest slot. A micro-batch spans few slots, so the table is
tiny; a batch spanning more than :data:`DENSE_SPAN` slots (a backlog) is left to the
numpy path (:class:`~lowtide.spark.tracking.column.TimeGroups`), which sorts.

The functions are compiled when this module is imported (eager signatures, cached on
disk by numba), so a Spark worker forked from lowtide's warm daemon starts with them
compiled. They compute exactly what the numpy path computes (its ``child_ids`` is the
same hash; ``tests/spark/tracking/test_column.py`` checks both paths against a plain
loop): the ids are a pure function of the rows (rule 5). They check no bounds: the
callers in :mod:`.column` pass arrays of one length and offsets inside the table."""

from __future__ import annotations

import numpy as np
from numba import njit, types

#: the widest span of slots (last minus first, plus one) a batch's dense table covers
DENSE_SPAN = 1 << 16

_MASK32 = np.uint64(0xFFFFFFFF)
_SLOTS = np.uint64(0xFFFFFFFF00000000)

# inputs are read-only (Arrow's zero-copy arrays are; a writable array converts)
_I64, _U64, _BOOL = (types.Array(t, 1, "C", readonly=True)
                     for t in (types.int64, types.uint64, types.boolean))
_OUT_I64, _OUT_U64 = types.Array(types.int64, 1, "C"), types.Array(types.uint64, 1, "C")
_SPAN_SIG = types.UniTuple(types.int64, 2)(_I64, types.int64)
_SUMS_SIG = types.Tuple((_OUT_U64, _OUT_I64))(_I64, types.int64, _U64, types.int64, types.int64)
_CHILD_SIG = types.Tuple((_OUT_I64, _OUT_U64, _OUT_U64, _OUT_I64, _OUT_I64))(
    _I64, types.uint64, _BOOL, types.int64, types.int64)
_OPTS = {"cache": True, "nogil": True, "boundscheck": False}


@njit(_SPAN_SIG, **_OPTS)
def key_span(keys, shift):  # type: ignore[no-untyped-def]
    """(smallest, largest) of ``keys >> shift``, the keys read as unsigned 64-bit
    (``shift`` 32 on a tracking column: its wrapped slots)."""
    lo = np.uint64(0xFFFFFFFFFFFFFFFF)
    hi = np.uint64(0)
    s = np.uint64(shift)
    for i in range(keys.shape[0]):
        k = np.uint64(keys[i]) >> s
        lo = min(lo, k)
        hi = max(hi, k)
    return np.int64(lo), np.int64(hi)


#: per-slot tables kept LANES times over, row i summed into lane i % LANES: rows of one
#: slot in a row (a source's, in label order) otherwise wait on each other's store
_LANES = 4


@njit(inline="always")
def _xor_lanes(table):  # type: ignore[no-untyped-def]
    out = table[0].copy()
    for lane in range(1, table.shape[0]):
        out ^= table[lane]
    return out


@njit(_SUMS_SIG, **_OPTS)
def xor_sums(keys, shift, values, lo, span):  # type: ignore[no-untyped-def]
    """Per key offset ``(keys >> shift) - lo`` in ``range(span)``: the XOR of the rows'
    ``values`` and their count. Empty ``values``: the keys' low 32 bits (the ids of a
    tracking column)."""
    xors = np.zeros((_LANES, span), np.uint64)
    counts = np.zeros((_LANES, span), np.int64)
    s = np.uint64(shift)
    own = values.shape[0] == 0
    for i in range(keys.shape[0]):
        u = np.uint64(keys[i])
        k = np.int64(u >> s) - lo
        lane = i % _LANES
        xors[lane, k] ^= (u & _MASK32) if own else values[i]
        counts[lane, k] += 1
    return _xor_lanes(xors), counts.sum(axis=0)


@njit(_CHILD_SIG, **_OPTS)
def children(packed, salt, keep, lo, span):  # type: ignore[no-untyped-def]
    """A map's or filter's pass over a tracking column: the children's column (one
    child per row, or per kept row where ``keep`` is not empty) with ids
    ``child_ids(parent id, salt)`` (murmur3's 32-bit finaliser, never 0), and per
    wrapped-slot offset the parents' XOR, the kept children's XOR, the parents'
    count and the children's count.

    Two loops: every row's child, independent of the others' (the compiler
    vectorises it), then the sums. Those go to one table of four words per (slot,
    lane), row i to lane i % 4: a row then never waits for the previous row's store
    to its slot, in whatever order the slots come. They come mixed after Spark's round
    robin (it sorts the rows by their bytes: four rows in five change slot) and in runs
    after a source or a tracked repartition (a hash keeps each sender's order).
    20,000 rows of six slots: 107 -> 57 us mixed, 48 -> 58 in runs, a filter's
    183 -> 73 and 113 -> 77 (against the loop that kept each run's sums in
    registers)."""
    n = packed.shape[0]
    masked = keep.shape[0] > 0
    out = np.empty(keep.sum() if masked else n, np.int64)
    child = np.empty(n, np.int64) if masked else out
    for i in range(n):
        u = np.uint64(packed[i])
        x = (u & _MASK32) ^ salt
        x ^= x >> np.uint64(16)
        x = (x * np.uint64(0x85EBCA6B)) & _MASK32
        x ^= x >> np.uint64(13)
        x = (x * np.uint64(0xC2B2AE35)) & _MASK32
        x ^= x >> np.uint64(16)
        child[i] = np.int64((u & _SLOTS) | max(x, np.uint64(1)))
    # per (slot, lane): parents' XOR, children's XOR, parents' count, children's count
    table = np.zeros(span * _LANES * 4, np.uint64)
    base = np.uint64(lo)
    j = 0
    for i in range(n):
        u = np.uint64(packed[i])
        cell = ((((u >> np.uint64(32)) - base) << np.uint64(2)) | np.uint64(i & 3)) << np.uint64(2)
        table[cell] ^= u & _MASK32
        table[cell + np.uint64(2)] += np.uint64(1)
        if masked:
            if not keep[i]:
                continue
            out[j] = child[i]
            j += 1
        table[cell + np.uint64(1)] ^= np.uint64(child[i]) & _MASK32
        table[cell + np.uint64(3)] += np.uint64(1)
    lanes = table.reshape((span, _LANES, 4))
    recv = np.zeros(span, np.uint64)
    sent = np.zeros(span, np.uint64)
    parents = np.zeros(span, np.int64)
    kids = np.zeros(span, np.int64)
    for k in range(span):
        for lane in range(_LANES):
            recv[k] ^= lanes[k, lane, 0]
            sent[k] ^= lanes[k, lane, 1]
            parents[k] += np.int64(lanes[k, lane, 2])
            kids[k] += np.int64(lanes[k, lane, 3])
    return out, recv, sent, parents, kids
