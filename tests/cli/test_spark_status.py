"""Progress views without Spark: status documents, stalled fronts, the CLI."""

from __future__ import annotations

import sys

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service.progress import RowRates, stalled_fronts
from lowtide.spark.pipeline import status_of

GRID = TimeGrid(delta_ms=10)


def test_stalled_front_is_the_one_behind_the_pack() -> None:
    fronts = {"0": ["parse", 1_000], "1": ["parse", 990], "2": ["parse", 600]}
    assert stalled_fronts(fronts, now_ms=10_200, grid=GRID) == [2]
    # everyone silent for a minute: all are named
    assert stalled_fronts(fronts, now_ms=10_000 + 61_000, grid=GRID) == [0, 1, 2]


def test_status_of_lag_and_rates() -> None:
    rates = RowRates()
    doc = {"global_min": 100, "now_ms": 1_500,
           "segments": [{"segment": "parse", "min_time": 100, "bound": 120,
                         "open_windows": 1, "in_flight": 3, "received": 0}],
           "fronts": {"0": ["parse", 120]}, "stuck": ["segment 'parse', ..."]}
    st = status_of(doc, GRID, rates)
    assert st.segments[0].lag_ms == 500 and st.segments[0].rows_per_s is None
    text = st.render(GRID.delta_ms)
    assert "parse" in text and "STUCK" in text


def test_status_shows_each_segments_inbound() -> None:
    graph = SegmentGraph.of(("pa", ()), ("pb", ()), ("sink", ("pa", "pb")))
    doc = {"global_min": 0, "now_ms": 1_000,
           "segments": [{"segment": n, "min_time": 0} for n in graph.names]}
    st = status_of(doc, GRID, graph=graph)
    assert [s.inbound for s in st.segments] == [(), (), ("pa", "pb")]
    assert st.render(GRID.delta_ms).splitlines()[-1].endswith("  pa, pb")


def test_import_lowtide_does_not_import_pyspark() -> None:
    import subprocess

    code = "import lowtide, sys; lowtide.Front; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_cli_registers_bench_and_spark_commands() -> None:
    from lowtide.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["bench", "spark", "--seconds", "1"])
    assert args.handler.__module__ == "lowtide.bench.spark" and args.seconds == 1
    args = parser.parse_args(["spark", "status", "--once"])
    assert args.handler.__name__ == "run_status"


@pytest.mark.socket
def test_spark_status_names_the_stalled_front(capsys) -> None:
    from lowtide.cli import main
    from lowtide.service import Agent, TrackerService

    graph = SegmentGraph.of(("parse", ()), ("sink", ("parse",)))
    with TrackerService.start(graph, grid=GRID) as svc:
        agent = Agent.connect(svc.url, graph)
        try:
            now = GRID.slot_of(__import__("time").time_ns() // 1_000_000)
            agent.register_front(1, "parse", now - 500)  # 5 s behind front 0
            agent.register_front(0, "parse", now)
            assert main(["spark", "status", "--url", svc.url, "--once"]) == 0
        finally:
            agent.close()
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("front")]
    assert any(ln.startswith("front 1") and "STALLED" in ln for ln in lines), out
    assert not any(ln.startswith("front 0") and "STALLED" in ln for ln in lines), out
