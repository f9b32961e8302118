"""``lowtide bench chaos --spark``'s hung tracker fault kinds on the shared session: a
standalone tracker SIGSTOPped before a sink (or a task) sends a batch's acks stops the
query within ``hold_wait_s`` with one line; resumed and restarted from the checkpoint,
the query re-runs that batch, and nothing is premature, written twice or lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from lowtide.bench import chaos

pytestmark = pytest.mark.spark


@pytest.mark.slow  # ~2 min; by default: test_hold_wait_e2e.py's sink and hold cases
def test_a_tracker_hung_under_a_sink_then_a_restart(spark, tmp_path: Path) -> None:
    from lowtide.bench.chaos.hung_fault import hung_sink_run

    result = hung_sink_run(spark, tmp_path)
    figures = chaos.summary([result])
    assert (figures["premature"], figures["lost"]) == (0, 0), (result.premature, result.notes)
    assert result.notes[0].startswith("stopped in time") and "SinkAcksFailed" in result.notes[0]
    assert "1 batches written again" in result.notes[-1], result.notes


@pytest.mark.slow  # ~2 min; by default: test_hold_wait_e2e.py's task case
def test_a_tracker_hung_under_a_task_then_a_restart(spark, tmp_path: Path) -> None:
    from lowtide.bench.chaos.hung_fault import hung_task_run

    result = hung_task_run(spark, tmp_path)
    figures = chaos.summary([result])
    assert (figures["premature"], figures["lost"]) == (0, 0), (result.premature, result.notes)
    assert result.notes[0].startswith("stopped in time"), result.notes
    assert "TaskAcksFailed" in result.notes[0] or "HoldFailed" in result.notes[0], result.notes
