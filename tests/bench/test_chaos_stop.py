"""``lowtide bench chaos --spark``'s "stopped while a sink writes": a ``write_parquet``
query stopped at once while one task of a micro-batch's write staged its file and the
other still runs; restarted from its checkpoint, it runs on. Nothing premature, nothing
lost, and nothing left in the output's ``_tmp`` (before the sink staged per batch and
cleaned up at the stop, the first task's staged file stayed there for good)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lowtide.bench import chaos

pytestmark = pytest.mark.spark


def test_a_query_stopped_in_a_write_then_restarted(spark, tmp_path: Path) -> None:
    from lowtide.bench.chaos.stop_fault import stopped_in_write_run

    result = stopped_in_write_run(spark, tmp_path)
    figures = chaos.summary([result])
    assert (figures["premature"], figures["lost"]) == (0, 0), (result.premature, result.notes)
    assert figures["left_behind"] == 0, result.notes
    assert not result.notes, result.notes  # the stop landed in a write
