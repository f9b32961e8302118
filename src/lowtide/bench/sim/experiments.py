"""One simulated run per (configuration, mode), and the paper's axes over them."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from lowtide.bench.sim.dataflow import US_PER_MS, Dataflow, SimConfig, make_workload
from lowtide.bench.sim.events import EventLoop, Links
from lowtide.bench.sim.markers import MarkerGate
from lowtide.bench.sim.snapshots import WindowGate
from lowtide.bench.sim.tracking import LowtideTracking

PER = 50_000  # the paper counts messages per 50K inputs
MODES = {
    "lowtide": "central",
    "lowtide sharded (2)": "sharded",
    "lowtide no local tracker": "direct",
    "markers": "markers",
}
SNAPSHOT_MODES = ("lowtide", "markers")


@dataclass(frozen=True)
class Axis:
    name: str  # "graph_size", "nodes", "granularity", "snapshot"
    field: str  # the SimConfig field it varies
    values: tuple[int, ...]
    label: str


AXES = (
    Axis("graph_size", "vertices", (10, 30, 100), "vertices in the chain"),
    Axis("nodes", "nodes", (10, 15, 20), "nodes"),
    Axis("granularity", "granularity", (1, 10, 100), "items per front per window / marker"),
)
SNAPSHOT_AXIS = Axis("snapshot", "snapshot_ms", (100, 500, 1000), "snapshot duration, ms")


@dataclass
class Sim:
    """A wired-up run: the loop, the flow, and the mode's parts (for tests to inspect)."""

    loop: EventLoop
    flow: Dataflow
    tracking: LowtideTracking | None = None
    markers: MarkerGate | None = None
    window_gate: WindowGate | None = None


def build(cfg: SimConfig, mode: str) -> Sim:
    """Wire ``mode`` (a key of MODES) on ``cfg``; ``sim.flow.start(); sim.loop.run()``."""
    kind = MODES[mode]
    loop = EventLoop()
    work = make_workload(cfg, markers=kind == "markers")
    sim = Sim(loop, Dataflow(cfg, work, loop, Links(cfg.latency_us, cfg.seed)))
    if kind == "markers":
        sim.markers = sim.flow.gate = MarkerGate(sim.flow)
        return sim
    sim.tracking = LowtideTracking(sim.flow, kind, notify_workers=cfg.snapshot_ms is not None)
    sim.flow.tracking = sim.tracking
    if cfg.snapshot_ms is not None:
        sim.window_gate = sim.flow.gate = WindowGate(sim.flow)
        sim.tracking.on_notified = sim.window_gate.notified
    return sim


def simulate(cfg: SimConfig, mode: str) -> dict[str, Any]:
    """Run ``mode`` on ``cfg`` to the end and measure it."""
    started = time.perf_counter()
    sim = build(cfg, mode)
    sim.flow.start()
    sim.loop.run()
    flow = sim.flow
    out: dict[str, Any] = {
        "inputs": flow.work.inputs,
        "sim_s": round(sim.loop.now_us / 1e6, 3),
        "events": sim.loop.events,
        "sunk": sum(t >= 0 for t in flow.sink_us),
    }
    if sim.markers is not None:
        out.update(marker_metrics(flow, sim.markers))
    if sim.tracking is not None:
        out.update(lowtide_metrics(flow, sim.tracking))
    out.update(buffering_metrics(flow))
    out["wall_s"] = round(time.perf_counter() - started, 2)
    return out


def latency_metrics(last_sink_us: np.ndarray, notified_us: np.ndarray) -> dict[str, Any]:
    """Per window: notification time minus the time its last item reached the sink.
    A window never notified is counted in ``windows - notified``; a negative latency
    would be a notification before the window's items arrived (``premature``)."""
    ok = notified_us >= 0
    lat_ms = (notified_us[ok] - last_sink_us[ok]) / US_PER_MS
    out: dict[str, Any] = {
        "windows": len(last_sink_us),
        "notified": int(ok.sum()),
        "premature": int((lat_ms < 0).sum()),
    }
    if len(lat_ms):
        out.update(
            latency_mean_ms=round(float(lat_ms.mean()), 3),
            latency_p50_ms=round(float(np.percentile(lat_ms, 50)), 3),
            latency_p99_ms=round(float(np.percentile(lat_ms, 99)), 3),
        )
    return out


def last_sink_by(keys: np.ndarray, sink_us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct keys (windows, epochs) with items, and each one's last sink arrival."""
    uniq, inverse = np.unique(keys, return_inverse=True)
    last = np.full(len(uniq), -1, np.int64)
    np.maximum.at(last, inverse, sink_us)
    return uniq, last


def lowtide_metrics(flow: Dataflow, tracking: LowtideTracking) -> dict[str, Any]:
    sink_us = np.asarray(flow.sink_us, np.int64)
    ws = flow.cfg.window_slots
    windows, last = last_sink_by(flow.work.slot // ws, sink_us)
    notes = np.asarray(tracking.notes or [(0, 0)], np.int64)
    mins = np.maximum.accumulate(notes[:, 1])
    first = np.searchsorted(mins, (windows + 1) * ws, side="left")  # first covering note
    notified = np.where(first < len(notes), notes[np.minimum(first, len(notes) - 1), 0], -1)
    c = tracking.counts
    scale = PER / flow.work.inputs
    out = {
        "messages": c["to_tracker"],
        "messages_per_50k": round(c["to_tracker"] * scale),
        "node_time_only": c["node_time_only"],
        "heartbeat_messages": c["heartbeat_messages"],
        "back_messages": c["back"],
        "back_per_50k": round(c["back"] * scale),
        "release_messages": c["releases"],
        "local_flushes": c["local_flushes"],
        "applied_flushes": tracking.server.applied_flushes,
        "window_slots": ws,
    }
    out.update(latency_metrics(last, notified))
    return out


def marker_metrics(flow: Dataflow, gate: MarkerGate) -> dict[str, Any]:
    sink_us = np.asarray(flow.sink_us, np.int64)
    epochs, last = last_sink_by(flow.work.epoch, sink_us)
    notified = np.array([gate.aligned_us.get(int(e), -1) for e in epochs], np.int64)
    scale = PER / flow.work.inputs
    out = {
        "messages": flow.marker_network_copies,
        "messages_per_50k": round(flow.marker_network_copies * scale),
        "marker_copies": flow.marker_copies,
        "epochs_per_front": int(flow.work.epoch.max()),
    }
    out.update(latency_metrics(last, notified))
    return out


def buffering_metrics(flow: Dataflow) -> dict[str, Any]:
    b, scale = flow.buffering, PER / flow.work.inputs
    return {
        "buffered": b.count,
        "buffered_per_50k": round(b.count * scale),
        "buffer_avg_ms": round(b.total_us / b.count / US_PER_MS, 3) if b.count else 0.0,
        "buffer_sum_s_per_50k": round(b.total_us / 1e6 * scale, 3),
    }


@dataclass(frozen=True)
class Plan:
    """Sizes: ``base`` is the fixed point of every axis; ``hop_budget`` caps inputs x
    vertices per run (pure Python); every run keeps at least ``min_epochs`` windows."""

    base: SimConfig
    snapshot: SimConfig
    hop_budget: int
    min_epochs: int = 8
    axes: tuple[Axis, ...] = AXES
    snapshot_axis: Axis = SNAPSHOT_AXIS

    def sized(self, cfg: SimConfig) -> SimConfig:
        inputs = min(cfg.inputs, self.hop_budget // cfg.vertices)
        inputs = max(inputs, self.min_epochs * cfg.granularity * cfg.nodes)
        return replace(cfg, inputs=inputs)


QUICK = Plan(
    SimConfig(inputs=4_000), SimConfig(rate_per_front_per_s=100, inputs=4_000), hop_budget=120_000
)
FULL = Plan(SimConfig(inputs=20_000), SimConfig(inputs=20_000), hop_budget=500_000)


def at(cfg: SimConfig, field: str, value: int) -> SimConfig:
    """``cfg`` with one field changed: an axis point."""
    changes: dict[str, Any] = {field: value}
    return replace(cfg, **changes)


def run_axes(plan: Plan) -> dict[str, Any]:
    """Every axis and mode; a configuration shared by axes runs once."""
    cache: dict[tuple[SimConfig, str], dict[str, Any]] = {}

    def measure(cfg: SimConfig, mode: str) -> dict[str, Any]:
        key = (cfg, mode)
        if key not in cache:
            cache[key] = simulate(cfg, mode)
            r = cache[key]
            print(
                f"[sim] {mode:<26} K={cfg.nodes} N={cfg.vertices} g={cfg.granularity} "
                f"snapshot={cfg.snapshot_ms} inputs={r['inputs']}: {r['events']:,} events, "
                f"{r['wall_s']} s",
                file=sys.stderr,
                flush=True,
            )
        return cache[key]

    axes: dict[str, Any] = {}
    for axis in (*plan.axes, plan.snapshot_axis):
        snapshot = axis is plan.snapshot_axis
        base = plan.snapshot if snapshot else plan.base
        modes = SNAPSHOT_MODES if snapshot else tuple(MODES)
        runs = {
            mode: [measure(plan.sized(at(base, axis.field, v)), mode) for v in axis.values]
            for mode in modes
        }
        axes[axis.name] = {
            "x": list(axis.values),
            "label": axis.label,
            "field": axis.field,
            "runs": runs,
        }
    return axes
