"""Fields shared by several messages: graphs, ack batches, int pairs and lists, names.

Ack batches are four packed numpy columns (``tobytes`` / ``frombuffer``): decoding a
batch of a million acks is four slices, never a million objects.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowtide.core.messages import AckBatch
from lowtide.wire.buffers import Reader, Writer
from lowtide.wire.messages import GraphSpec

_ACK_DTYPES: tuple[np.dtype[Any], ...] = (
    np.dtype("<i4"),
    np.dtype("<i8"),
    np.dtype("<u8"),
    np.dtype("<i8"),
)
_ACK_NATIVE: tuple[type, ...] = (np.int32, np.int64, np.uint64, np.int64)
_ACK_ROW_BYTES = sum(d.itemsize for d in _ACK_DTYPES)


def put_graph(w: Writer, graph: GraphSpec) -> None:
    w.pack("I", len(graph))
    for name, inbound, *ranged in graph:
        w.text(name)
        w.pack("I", len(inbound))
        for up in inbound:
            w.text(up)
        n, fronts, *detached = ranged if ranged else (0, ())
        # 0: as listed by SegmentGraph.of; 1, 2: a later generation's, attached, detached
        w.pack("BII", 1 + bool(detached[0]) if detached else 0, n, len(fronts))
        for front, ranges in fronts:
            w.pack("qI", front, len(ranges))
            for r in ranges:
                w.pack("I", r)


def get_graph(r: Reader) -> GraphSpec:
    out: list[tuple[Any, ...]] = []
    for _ in range(r.count()):
        name, inbound = r.text(), tuple(r.text() for _ in range(r.count()))
        kind, n = r.unpack("BI")
        fronts = tuple((r.one("q"), tuple(r.one("I") for _ in range(r.count())))
                       for _ in range(r.count()))
        if kind:
            out.append((name, inbound, 0, (), kind - 1))
        else:
            out.append((name, inbound) if not n else (name, inbound, n, fronts))
    return tuple(out)


def put_acks(w: Writer, acks: AckBatch) -> None:
    w.pack("I", len(acks))
    columns: tuple[np.ndarray[Any, Any], ...] = (acks.segment, acks.time, acks.xor, acks.count)
    for column, dtype in zip(columns, _ACK_DTYPES, strict=True):
        w.array(column, dtype)


def get_acks(r: Reader) -> AckBatch:
    n = r.count()
    raw = r.take(n * _ACK_ROW_BYTES)  # the four columns, one after the other
    columns: list[np.ndarray[Any, Any]] = []
    at = 0
    for d, t in zip(_ACK_DTYPES, _ACK_NATIVE, strict=True):
        columns.append(np.frombuffer(raw, d, n, at).astype(t, copy=False))
        at += n * d.itemsize
    return AckBatch(*columns)


def put_pairs(w: Writer, pairs: tuple[tuple[int, int], ...] | list[tuple[int, int]]) -> None:
    """Pairs of int64 as two packed columns (heartbeats, node-time vectors)."""
    w.pack("I", len(pairs))
    if not pairs:  # two empty columns: nothing more (most task batches beat no front)
        return
    arr = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    w.array(arr[:, 0], np.dtype("<i8"))
    w.array(arr[:, 1], np.dtype("<i8"))


def get_pairs(r: Reader) -> list[tuple[int, int]]:
    n = r.count()
    if n == 0:
        return []
    i8 = np.dtype("<i8")
    a, b = r.array(n, i8, np.int64), r.array(n, i8, np.int64)
    return list(zip(a.tolist(), b.tolist(), strict=True))


def put_ints(w: Writer, values: tuple[int, ...]) -> None:
    w.pack("I", len(values))
    w.array(np.array(values, dtype=np.int64), np.dtype("<i8"))


def get_ints(r: Reader) -> tuple[int, ...]:
    return tuple(r.array(r.count(), np.dtype("<i8"), np.int64).tolist())


def put_pair(w: Writer, pair: tuple[int, int] | None) -> None:
    w.pack("B", pair is not None)
    if pair is not None:
        w.pack("II", *pair)


def get_pair(r: Reader) -> tuple[int, int] | None:
    if not r.one("B"):
        return None
    first, second = r.unpack("II")
    return first, second


def put_names(w: Writer, names: tuple[str, ...]) -> None:
    w.pack("I", len(names))
    for name in names:
        w.text(name)


def get_names(r: Reader) -> tuple[str, ...]:
    return tuple(r.text() for _ in range(r.count()))
