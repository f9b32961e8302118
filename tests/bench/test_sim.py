"""`lowtide bench sim` on tiny clusters: counts add up, safety, liveness, figures."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import numpy as np
import pytest

from lowtide.bench import sim as sim_bench
from lowtide.bench.figures import Figure
from lowtide.bench.sim import figures, run_plan
from lowtide.bench.sim.dataflow import SimConfig
from lowtide.bench.sim.experiments import MODES, Axis, Plan, Sim, build, simulate
from lowtide.bench.sim.markers import expected_network_copies
from lowtide.bench.sim.report import table

TINY = SimConfig(nodes=3, vertices=4, inputs=150, granularity=5, seed=3)
SNAPSHOT = replace(
    TINY, inputs=240, rate_per_front_per_s=100, snapshot_ms=100, snapshot_window_ms=200
)
LOWTIDE_MODES = [m for m in MODES if m != "markers"]


def finished(cfg: SimConfig, mode: str) -> Sim:
    sim = build(cfg, mode)
    sim.flow.start()
    sim.loop.run()
    return sim


def notified_windows(sim: Sim) -> list[tuple[int, int]]:
    """(window, first time its end was announced at the bench stand)."""
    assert sim.tracking is not None
    ws, out, done = sim.flow.cfg.window_slots, [], 0
    for time_us, min_time in sim.tracking.notes:
        while (done + 1) * ws <= min_time:
            out.append((done, time_us))
            done += 1
    return out


@pytest.mark.parametrize("mode", LOWTIDE_MODES)
def test_lowtide_is_safe_and_live(mode: str) -> None:
    sim = finished(TINY, mode)
    assert sim.tracking is not None
    sink_us = np.asarray(sim.flow.sink_us)
    slots = sim.flow.work.slot
    assert (sink_us >= 0).all()  # every item reached the bench stand
    # safety: when "nothing below M is in flight" arrives, every item below M has arrived
    for time_us, min_time in sim.tracking.notes:
        below = slots < min_time
        assert (sink_us[below] <= time_us).all()
    # liveness: the last notification covers every item's window
    assert sim.tracking.notes[-1][1] > int(slots.max())


def test_local_tracker_flushes_are_all_applied() -> None:
    sim = finished(TINY, "lowtide")
    assert sim.tracking is not None
    counts = sim.tracking.counts
    assert counts["local_flushes"] == counts["to_tracker"] == sim.tracking.server.applied_flushes
    assert counts["local_flushes"] > 0


def test_sharded_flush_parts_are_all_applied() -> None:
    sim = finished(TINY, "lowtide sharded (2)")
    assert sim.tracking is not None
    counts = sim.tracking.counts
    assert counts["to_tracker"] == sim.tracking.server.applied_flushes
    # every flush with acks reaches both shards (its NodeTime at least)
    assert counts["local_flushes"] < counts["to_tracker"] <= 2 * counts["local_flushes"]


def test_without_local_tracker_every_ack_is_a_message() -> None:
    sim = finished(TINY, "lowtide no local tracker")
    assert sim.tracking is not None
    counts, n, items = sim.tracking.counts, TINY.vertices, sim.flow.work.inputs
    # front send + 2 per vertex (send on, receive) + sink receive
    acks = items * (2 * n + 2)
    assert counts["to_tracker"] == acks + counts["heartbeat_messages"]


def test_sharded_notifies_the_same_windows_as_central() -> None:
    central = notified_windows(finished(TINY, "lowtide"))
    sharded = notified_windows(finished(TINY, "lowtide sharded (2)"))
    assert [w for w, _ in central] == [w for w, _ in sharded]
    assert len(central) >= int(
        TINY.items_per_front * 1000 / TINY.rate_per_front_per_s / TINY.window_slots
    )


@pytest.mark.parametrize("nodes,vertices,g", [(3, 4, 5), (2, 2, 1), (4, 3, 10)])
def test_marker_copies_follow_the_formula(nodes: int, vertices: int, g: int) -> None:
    cfg = replace(TINY, nodes=nodes, vertices=vertices, granularity=g, inputs=80)
    sim = finished(cfg, "markers")
    epochs = cfg.items_per_front // g
    assert sim.flow.marker_network_copies == expected_network_copies(epochs, nodes, vertices)
    assert sim.flow.marker_copies == epochs * (vertices * nodes * nodes + nodes)


def test_markers_align_after_their_epoch_reached_the_sink() -> None:
    sim = finished(TINY, "markers")
    assert sim.markers is not None
    sink_us = np.asarray(sim.flow.sink_us)
    epochs = sim.flow.work.epoch
    aligned = sim.markers.aligned_us
    assert sorted(aligned) == list(range(1, int(epochs.max()) + 1))  # liveness
    for epoch, time_us in aligned.items():
        assert (sink_us[epochs <= epoch] <= time_us).all()  # safety


@pytest.mark.parametrize("mode", ["lowtide", "markers"])
def test_snapshots_buffer_and_still_finish(mode: str) -> None:
    result = simulate(SNAPSHOT, mode)
    assert result["sunk"] == result["inputs"]
    assert result["notified"] == result["windows"]
    assert result["premature"] == 0
    assert result["buffered"] > 0
    assert result["buffer_avg_ms"] > 0


def test_lowtide_snapshots_hold_later_windows_until_notified() -> None:
    sim = finished(SNAPSHOT, "lowtide")
    assert sim.window_gate is not None
    windows = sim.flow.work.slot.max() // SNAPSHOT.snapshot_window_ms
    # one snapshot per node per completed window (a jump may cover two)
    assert 0 < sim.window_gate.snapshots <= SNAPSHOT.nodes * (windows + 2)


def test_runs_are_deterministic() -> None:
    a, b = simulate(TINY, "lowtide sharded (2)"), simulate(TINY, "lowtide sharded (2)")
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


TINY_PLAN = Plan(
    TINY,
    SNAPSHOT,
    hop_budget=600,
    min_epochs=2,
    axes=(
        Axis("graph_size", "vertices", (2, 3), "vertices"),
        Axis("nodes", "nodes", (2, 3), "nodes"),
        Axis("granularity", "granularity", (1, 5), "items per window"),
    ),
    snapshot_axis=Axis("snapshot", "snapshot_ms", (50, 100), "snapshot ms"),
)


def test_harness_result_tables_and_figures() -> None:
    result = json.loads(json.dumps(run_plan(TINY_PLAN, quick=True)))
    assert result["bench"] == "sim"
    for name, axis in result["axes"].items():
        assert table(name, axis).count("\n") >= len(axis["x"])
        for runs in axis["runs"].values():
            assert all(r["notified"] == r["windows"] and r["premature"] == 0 for r in runs)
    figs = figures(result)
    assert all(isinstance(f, Figure) for f in figs)
    names = {f.name for f in figs}
    for prefix in ("traffic_by_", "notification_latency_by_"):
        assert {prefix + a for a in ("graph_size", "nodes", "granularity")} <= names
    assert {"buffering_count", "buffering_average_duration", "buffering_sum_duration"} <= names
    traffic = next(f for f in figs if f.name == "traffic_by_nodes")
    assert list(traffic.series) == list(MODES)
    assert traffic.paper and "markers" in traffic.note


def test_command_prints_tables_then_the_json_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sim_bench, "QUICK", TINY_PLAN)
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    bench = sub.add_parser("bench").add_subparsers()
    sim_bench.register(sub, bench)
    args = parser.parse_args(["bench", "sim", "--quick", "--seed", "5"])
    assert args.handler(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "== graph_size ==" in out
    result = json.loads(out[-1])
    assert result["bench"] == "sim" and result["quick"] is True
    assert result["config"]["seed"] == 5
