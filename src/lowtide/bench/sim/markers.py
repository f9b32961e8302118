"""Punctuations (markers), as Flink's aligned checkpoint barriers, in the simulated cluster.

A front emits marker e after its e-th group of ``granularity`` items (with snapshots: at
each snapshot window boundary). Every repartition broadcasts a marker to all K instances
of the next vertex. An instance that got marker e on an input channel blocks that
channel: later entries from it wait in the channel's buffer. Once marker e has been
processed from all K channels (alignment), the instance forwards e to all K downstream
instances and unblocks its channels. The bench stand aligns the same way: marker e
aligned there is the notification that epoch e is complete.

Why aligned: it is Flink's default (exactly-once) mode and what the paper compares with;
unaligned checkpoints do not hold items back but are not a completeness notification.
With snapshots an aligned instance forwards the marker first and then snapshots for
``snapshot_ms``, buffering its input meanwhile (Flink also sends the barrier downstream
before it takes the snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lowtide.bench.sim.dataflow import US_PER_MS, Dataflow


@dataclass
class _Instance:
    blocked: list[bool]
    got: int = 0  # channels whose current marker has been processed
    resting: bool = False  # snapshotting: everything waits
    buffer: list[tuple[int, int, int]] = field(default_factory=list)  # (since_us, ch, entry)


class MarkerGate:
    """Alignment at every vertex instance and at the bench stand."""

    def __init__(self, flow: Dataflow) -> None:
        self.flow = flow
        k = flow.cfg.nodes
        self._width = flow.cfg.vertices + 1
        self._instances = [_Instance([False] * k) for _ in range(k * self._width)]
        self._sink_got: dict[int, int] = {}
        self.aligned_us: dict[int, int] = {}  # epoch -> when aligned at the bench stand
        snapshot_ms = flow.cfg.snapshot_ms
        self._snapshot_us = None if snapshot_ms is None else snapshot_ms * US_PER_MS

    def admit(self, node: int, stage: int, ch: int, entry: int) -> bool:
        inst = self._instances[node * self._width + stage]
        if inst.resting or inst.blocked[ch]:
            inst.buffer.append((self.flow.loop.now_us, ch, entry))
            return False
        if entry < 0:
            inst.blocked[ch] = True
        return True

    def marker_processed(self, node: int, stage: int, ch: int, epoch: int) -> None:
        inst = self._instances[node * self._width + stage]
        inst.got += 1
        if inst.got < self.flow.cfg.nodes:
            return
        inst.got = 0
        inst.blocked = [False] * self.flow.cfg.nodes
        self.flow.broadcast(node, stage, -epoch)
        if self._snapshot_us is None:
            self._replay(node, stage, inst)
        else:
            inst.resting = True
            loop = self.flow.loop
            loop.at(loop.now_us + self._snapshot_us, self._resume, node, stage, inst)

    def marker_at_sink(self, ch: int, epoch: int) -> None:
        got = self._sink_got.get(epoch, 0) + 1
        self._sink_got[epoch] = got
        if got == self.flow.cfg.nodes:
            self.aligned_us[epoch] = self.flow.loop.now_us

    def _resume(self, node: int, stage: int, inst: _Instance) -> None:
        inst.resting = False
        self._replay(node, stage, inst)

    def _replay(self, node: int, stage: int, inst: _Instance) -> None:
        """Buffered entries in arrival order, as if they arrived now; a marker among them
        blocks its channel again and the rest of that channel stays buffered."""
        old, inst.buffer = inst.buffer, []
        now = self.flow.loop.now_us
        for since, ch, entry in old:
            if inst.resting or inst.blocked[ch]:
                inst.buffer.append((since, ch, entry))
                continue
            if entry < 0:
                inst.blocked[ch] = True
            else:
                self.flow.buffering.release(since, now)
            self.flow.enqueue(node, stage, ch, entry)


def expected_network_copies(epochs_per_front: int, nodes: int, vertices: int) -> int:
    """Marker copies that cross the network: per epoch, each of the N repartitions sends
    K x (K - 1) copies between distinct nodes, and the K last instances one each to the
    bench stand."""
    return epochs_per_front * (vertices * nodes * (nodes - 1) + nodes)
