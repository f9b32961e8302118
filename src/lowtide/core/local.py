"""Local tracker: one per process, between the operators and the tracker.

It XOR-merges acks by (segment, window) and sums their counts, keeps only the latest
heartbeat per front, and flushes by size or age. A flush lists acks in descending
(segment topological index, window) order, heartbeats last (rule 2): an operator's
children live in later segments or later windows than its input, so their send-acks
are applied no later than the input's receive-ack, and the heartbeats travel after
every ack they cover.

>>> lt = LocalTrackerConfig(TimeGrid(window_slots=10), max_age_ms=5).build(node=3)
>>> lt.add_acks(AckBatch.of([Ack(0, 12, 0b01, 1), Ack(0, 17, 0b10, 1), Ack(1, 3, 4, 1)]), now_ms=0)
>>> lt.add_heartbeat(Heartbeat(front=1, time=20), now_ms=1)
>>> lt.poll(now_ms=4) is None, lt.next_deadline_ms()
(True, 5)
>>> f = lt.poll(now_ms=5)
>>> [(a.segment, a.time, a.xor, a.count) for a in f.acks.to_acks()], f.heartbeats
([(1, 0, 4, 1), (0, 10, 3, 2)], (Heartbeat(front=1, time=20, owner=0),))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lowtide.core.errors import NonMonotonicHeartbeat
from lowtide.core.messages import Ack, AckBatch, Flush, Heartbeat  # noqa: F401 (doctest)
from lowtide.core.time import TimeGrid


@dataclass(frozen=True)
class LocalTrackerConfig:
    grid: TimeGrid = TimeGrid()
    max_age_ms: int = 5
    max_entries: int = 65_536

    def build(self, node: int) -> LocalTracker:
        return LocalTracker(self, node)


def merge_acks(batch: AckBatch, window_slots: int) -> AckBatch:
    """XOR-merge by (segment, window), drop entries that cancel out, and order them
    by descending (segment, window); times become window starts. (A task's batch is
    merged when it is built and again when it is sent: the second finds nothing to
    merge or drop, and skips that work.)"""
    if len(batch) == 0:
        return batch
    windows = batch.time // window_slots
    order = np.lexsort((windows, batch.segment))[::-1]
    seg, win = batch.segment[order], windows[order]
    xors, counts = batch.xor[order], batch.count[order]
    change = (seg[1:] != seg[:-1]) | (win[1:] != win[:-1])
    if not change.all():
        starts = np.flatnonzero(np.concatenate(([True], change)))
        seg, win = seg[starts], win[starts]
        xors, counts = np.bitwise_xor.reduceat(xors, starts), np.add.reduceat(counts, starts)
    keep = (xors != 0) | (counts != 0)
    if not keep.all():
        seg, win, xors, counts = seg[keep], win[keep], xors[keep], counts[keep]
    return AckBatch(seg, win * window_slots, xors, counts)


class LocalTracker:
    def __init__(self, config: LocalTrackerConfig, node: int) -> None:
        self.config = config
        self.node = node
        self._acks: list[AckBatch] = []
        self._entries = 0
        self._heartbeats: dict[int, Heartbeat] = {}
        self._oldest_ms: int | None = None
        self._seq = 0

    def add_acks(self, batch: AckBatch, now_ms: int) -> None:
        if len(batch) == 0:
            return
        self._acks.append(batch)
        self._entries += len(batch)
        self._touch(now_ms)

    def add_heartbeat(self, hb: Heartbeat, now_ms: int) -> None:
        last = self._heartbeats.get(hb.front)
        if last is not None and hb.time < last.time:
            raise NonMonotonicHeartbeat(
                f"front {hb.front} went back from {last.time} to {hb.time}")
        self._heartbeats[hb.front] = hb
        self._touch(now_ms)

    def pending(self) -> int:
        """Raw entries (acks and heartbeats) waiting for the next flush."""
        return self._entries + len(self._heartbeats)

    def next_deadline_ms(self) -> int | None:
        """When :meth:`poll` will flush by age; None while nothing is pending."""
        return None if self._oldest_ms is None else self._oldest_ms + self.config.max_age_ms

    def poll(self, now_ms: int) -> Flush | None:
        """A flush if one is due by size or age, else None."""
        deadline = self.next_deadline_ms()
        if deadline is None:
            return None
        if self._entries >= self.config.max_entries or now_ms >= deadline:
            return self.flush()
        return None

    def flush(self) -> Flush | None:
        """Everything pending, now; None if nothing is."""
        if self._oldest_ms is None:
            return None
        acks = merge_acks(AckBatch.concat(self._acks), self.config.grid.window_slots)
        heartbeats = tuple(hb for _f, hb in sorted(self._heartbeats.items()))
        self._acks, self._entries, self._heartbeats, self._oldest_ms = [], 0, {}, None
        self._seq += 1
        return Flush(self.node, self._seq, acks, heartbeats)

    def _touch(self, now_ms: int) -> None:
        if self._oldest_ms is None:
            self._oldest_ms = now_ms
