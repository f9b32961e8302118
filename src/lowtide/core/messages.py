"""Messages between fronts, operators, local trackers, tracker shards and listeners.

All are frozen dataclasses. The hot path never builds one object per ack: acks travel
as an :class:`AckBatch` of four numpy columns. ``count`` is +1 per send and -1 per
receive, summed, so a stuck window tells loss (count > 0) from duplication (count < 0).

>>> b = AckBatch.of([Ack(0, 5, 0xAB, 1), Ack(1, 5, 0xAB, -1)])
>>> len(b), b.to_acks()[1]
(2, Ack(segment=1, time=5, xor=171, count=-1))
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]


@dataclass(frozen=True)
class Ack:
    """One (merged) ack: XOR of ack values and net count for (segment, time)."""

    segment: int
    time: int
    xor: int
    count: int


@dataclass(frozen=True)
class Heartbeat:
    """The front will never again emit an item with slot < time. ``owner``: the
    front's owner id (see :class:`RegisterFront`); anyone else's heartbeat is refused."""

    front: int
    time: int
    owner: int = 0


@dataclass(frozen=True)
class RegisterFront:
    """A front starts feeding source segment ``segment`` with items of slot >= time.
    ``owner``: an opaque id; only the same owner may move or unregister the front.
    ``session``: who registers it (one live session of an owner holds a front)."""

    front: int
    segment: str
    time: int
    owner: int = 0
    session: int = 0


@dataclass(frozen=True)
class UnregisterFront:
    """The front is done: it no longer holds its segment's bound back."""

    front: int
    owner: int = 0
    session: int = 0


@dataclass(frozen=True)
class DeclareFront:
    """A front that may still produce into source segment ``segment`` from slot
    ``time`` on (-1: where the segment starts, see :mod:`lowtide.core.fronts`): the
    segment's bound waits for it until it registers or is retired (by ``owner``, or
    once ``retire_after_ms`` of tracker time passed; None: never)."""

    front: int
    segment: str
    time: int
    owner: int = 0
    retire_after_ms: int | None = None


@dataclass(frozen=True)
class RetireFront:
    """The declaring owner gives up on a declared front that never registered."""

    front: int
    owner: int = 0


@dataclass(frozen=True)
class Subscribe:
    """Deliver min time updates of ``segment`` (None: the global min time)."""

    subscriber: int
    segment: str | None


@dataclass(frozen=True)
class Unsubscribe:
    subscriber: int
    segment: str | None


@dataclass(frozen=True)
class MinTimeUpdate:
    """Nothing with slot < ``time`` is in flight in ``segment`` (None: anywhere)."""

    segment: str | None
    time: int


@dataclass(frozen=True)
class NodeTime:
    """Sent to every shard with a node's flush that carries acks (rule 8).

    ``min_time`` is the smallest ack time in the whole flush, over all shards: until
    every shard has applied this flush, the aggregate must not pass it.
    """

    node: int
    counter: int
    min_time: int


@dataclass(frozen=True)
class AckBatch:
    """Columns of acks; row i is Ack(segment[i], time[i], xor[i], count[i])."""

    segment: I32
    time: I64
    xor: U64
    count: I64

    def __post_init__(self) -> None:
        n = len(self.segment)
        if not (len(self.time) == len(self.xor) == len(self.count) == n):
            raise ValueError("AckBatch columns differ in length")
        if (
            self.segment.dtype != np.int32
            or self.time.dtype != np.int64
            or self.xor.dtype != np.uint64
            or self.count.dtype != np.int64
        ):
            raise TypeError("AckBatch columns must be int32, int64, uint64, int64")

    @classmethod
    def from_columns(
        cls,
        segment: npt.ArrayLike,
        time: npt.ArrayLike,
        xor: npt.ArrayLike,
        count: npt.ArrayLike,
    ) -> AckBatch:
        """Build from anything array-like; a scalar segment or count is broadcast."""
        t = np.asarray(time, dtype=np.int64).reshape(-1)
        n = len(t)
        return cls(
            np.broadcast_to(np.asarray(segment, dtype=np.int32), (n,)).copy(),
            t,
            np.asarray(xor, dtype=np.uint64).reshape(-1),
            np.broadcast_to(np.asarray(count, dtype=np.int64), (n,)).copy(),
        )

    @classmethod
    def empty(cls) -> AckBatch:
        return cls.from_columns([], [], [], [])

    @classmethod
    def of(cls, acks: Iterable[Ack]) -> AckBatch:
        rows = list(acks)
        return cls.from_columns(
            [a.segment for a in rows],
            [a.time for a in rows],
            [a.xor for a in rows],
            [a.count for a in rows],
        )

    @classmethod
    def concat(cls, batches: Sequence[AckBatch]) -> AckBatch:
        if not batches:
            return cls.empty()
        if len(batches) == 1:
            return batches[0]
        return cls(
            np.concatenate([b.segment for b in batches]),
            np.concatenate([b.time for b in batches]),
            np.concatenate([b.xor for b in batches]),
            np.concatenate([b.count for b in batches]),
        )

    def __len__(self) -> int:
        return len(self.segment)

    def take(self, rows: npt.NDArray[np.bool_] | npt.NDArray[np.intp]) -> AckBatch:
        return AckBatch(self.segment[rows], self.time[rows], self.xor[rows], self.count[rows])

    def to_acks(self) -> list[Ack]:
        return [
            Ack(int(s), int(t), int(x), int(c))
            for s, t, x, c in zip(self.segment, self.time, self.xor, self.count, strict=True)
        ]


@dataclass(frozen=True)
class Flush:
    """What a local tracker sends in one go, in rule-2 order: acks, then heartbeats."""

    node: int
    seq: int
    acks: AckBatch
    heartbeats: tuple[Heartbeat, ...] = ()


@dataclass(frozen=True)
class ShardFlush:
    """The part of a node's flush for one shard; applied by the shard atomically."""

    shard: int
    node_time: NodeTime | None
    acks: AckBatch
    heartbeats: tuple[Heartbeat, ...] = ()


@dataclass(frozen=True)
class ShardReport:
    """A shard's view after a step: its min times per checksum row, each segment's then
    each key range's (rule 15; :func:`~lowtide.core.sharding.cell_names`), which may go
    down (see :mod:`lowtide.core.sharding`), its node-time vector and the flushes
    ``(node, counter, min_time)`` it applied since its previous report."""

    shard: int
    min_times: tuple[int, ...]
    node_times: tuple[tuple[int, int], ...]
    flushes: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class ShardRelease:
    """From the aggregator to the shards: announced min times per checksum row (as in
    :class:`ShardReport`). No legal ack is older, so shards may drop windows below them."""

    min_times: tuple[int, ...]
