"""Snapshot buffering with lowtide: process the current snapshot window only.

The paper's state-snapshotting experiment: every vertex instance processes items of
the current snapshot window and buffers items of later windows until it is notified
that the current window is complete; then it "snapshots" (sleeps) for a fixed time and
goes on with the next window. With lowtide the notification is the tracker's global
min time passing the window's end, sent to every worker node; all instances on a node
snapshot together (a sleep holds no CPU, so other nodes keep going).
"""

from __future__ import annotations

from lowtide.bench.sim.dataflow import US_PER_MS, Dataflow, OpenGate


class WindowGate(OpenGate):
    def __init__(self, flow: Dataflow) -> None:
        cfg = flow.cfg
        if cfg.snapshot_ms is None:
            raise ValueError("WindowGate needs snapshot_ms")
        self.flow = flow
        self._snapshot_us = cfg.snapshot_ms * US_PER_MS
        self._window_slots = cfg.snapshot_window_ms  # slots are 1 ms
        self._window = (flow.work.slot // self._window_slots).tolist()  # item -> window
        self._current = [0] * cfg.nodes
        self._target = [0] * cfg.nodes  # the furthest window a notification allows
        self._resting = [False] * cfg.nodes
        self._buffer: list[list[tuple[int, int, int, int]]] = [[] for _ in range(cfg.nodes)]
        self.snapshots = 0

    def admit(self, node: int, stage: int, ch: int, entry: int) -> bool:
        if self._resting[node] or self._window[entry] > self._current[node]:
            self._buffer[node].append((self.flow.loop.now_us, stage, ch, entry))
            return False
        return True

    def notified(self, node: int, min_time: int) -> None:
        if node >= self.flow.cfg.nodes:
            return  # the bench stand does not snapshot
        self._target[node] = max(self._target[node], min_time // self._window_slots)
        if not self._resting[node] and self._target[node] > self._current[node]:
            self._rest(node)

    def _rest(self, node: int) -> None:
        self._resting[node] = True
        self.snapshots += 1
        loop = self.flow.loop
        loop.at(loop.now_us + self._snapshot_us, self._resume, node, self._target[node])

    def _resume(self, node: int, window: int) -> None:
        self._resting[node] = False
        self._current[node] = window
        old, self._buffer[node] = self._buffer[node], []
        now = self.flow.loop.now_us
        for since, stage, ch, item in old:
            if self._window[item] > window:
                self._buffer[node].append((since, stage, ch, item))
            else:
                self.flow.buffering.release(since, now)
                self.flow.enqueue(node, stage, ch, item)
        if self._target[node] > window:  # a later window completed while snapshotting
            self._rest(node)
