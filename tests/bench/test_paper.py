"""`lowtide bench paper` on stand-in sub-benches: results, figures, report, failures."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import pytest

from lowtide.bench import paper
from lowtide.bench.figures import Figure, table_md

FAKE = textwrap.dedent(
    '''
    import json, sys
    from lowtide.bench.figures import Figure

    REPORT_INTRO = "A stand-in bench: two modes, three sizes."

    def figures(result):
        return [Figure("traffic_by_graph_size", "Traffic by graph size", "vertices",
                       "messages", result["sizes"], result["series"],
                       paper={"tracker": "0.2-0.5M"}, note="ours is smaller")]

    if __name__ == "__main__":
        if "--fail" in sys.argv:
            sys.exit(3)
        print("a human table")
        print(json.dumps({"bench": "fake", "quick": "--quick" in sys.argv, "sizes": [10, 30, 100],
                          "series": {"lowtide": [1, 2, 3], "markers": [10, 20, 30]}}))
    '''
)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "fake_bench.py").write_text(FAKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "fake_bench.py"


def args(out: Path, only: list[str] | None = None) -> argparse.Namespace:
    return argparse.Namespace(quick=True, out=str(out), only=only, timeout_s=60.0)


def test_report_has_every_figure_with_its_table_and_png(fake: Path, tmp_path: Path) -> None:
    bench = paper.SubBench("fake", "fake_bench", (sys.executable, str(fake)))
    doc = paper.run(args(tmp_path / "out"), [bench])
    assert doc["figures"] == 1 and doc["failed"] == []
    report = Path(doc["report"]).read_text()
    assert "![Traffic by graph size](figures/traffic_by_graph_size.png)" in report
    assert (tmp_path / "out" / "figures" / "traffic_by_graph_size.png").stat().st_size > 1000
    assert "| 100 | 3 | 30 |" in report and "tracker: 0.2-0.5M" in report
    assert "A stand-in bench" in report
    saved = json.loads((tmp_path / "out" / "logs" / "fake.json").read_text())
    assert saved["quick"] is True  # --quick is passed on


def test_a_failing_bench_is_reported_and_the_rest_still_run(fake: Path, tmp_path: Path) -> None:
    bad = paper.SubBench("bad", "fake_bench", (sys.executable, str(fake), "--fail"))
    good = paper.SubBench("fake", "fake_bench", (sys.executable, str(fake)))
    doc = paper.run(args(tmp_path / "out"), [bad, good])
    assert doc["failed"] == ["bad"] and doc["figures"] == 1
    assert "**Failed: exit code 3.**" in Path(doc["report"]).read_text()


def test_unknown_sub_bench_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown sub-bench"):
        paper.run(args(tmp_path, only=["nope"]))


def test_last_json_line_is_the_result() -> None:
    assert paper.last_json('table\n{"bench": "x", "n": 1}\n\n') == {"bench": "x", "n": 1}
    with pytest.raises(ValueError):
        paper.last_json("table only\n")


def test_figure_rejects_misaligned_series() -> None:
    with pytest.raises(ValueError, match="2 values for 3"):
        Figure("f", "t", "x", "y", [1, 2, 3], {"a": [1, 2]})
    fig = Figure("f", "t", "x", "y", ["a", "b"], {"s": [1.5, None]})
    assert table_md(fig).splitlines()[-1] == "| b | - |"
