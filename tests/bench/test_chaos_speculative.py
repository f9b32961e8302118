"""``lowtide bench chaos --spark``'s speculative window fault kind on the shared
session: task failures before the window and after its changelog step, a lagging
front and a restart from the checkpoint find nothing premature and nothing lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from lowtide.bench import chaos

pytestmark = pytest.mark.spark


@pytest.mark.slow  # ~1-5 min; the same faults by default: test_speculative_e2e.py's JVM plan
def test_a_speculative_window_under_task_failures_and_a_restart(spark, tmp_path: Path
                                                                ) -> None:
    from lowtide.bench.chaos.speculative_fault import result_of, speculative_run

    run = speculative_run(spark, tmp_path)
    result = result_of(run)
    figures = chaos.summary([result])
    assert (figures["premature"], figures["lost"]) == (0, 0), (result.premature, result.notes)
    assert (run.rows["op"] == "tombstone").any()  # early versions were replaced
    assert run.rows["batch"].nunique() > 3 and run.claimed_ms > run.t0
