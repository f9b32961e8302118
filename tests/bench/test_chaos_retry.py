"""``lowtide bench chaos --spark``'s retry loop fault kind on the shared session: a
task failure after the step's acks and a restart with rows in the loop find nothing
premature and nothing lost, and every record given up is a dead letter once."""

from __future__ import annotations

from pathlib import Path

import pytest

from lowtide.bench import chaos

pytestmark = pytest.mark.spark


def test_a_retry_loop_under_a_task_failure_and_a_restart(spark, tmp_path: Path) -> None:
    from lowtide.bench.chaos.retry_fault import given_up, result_of, retry_loop_run

    run = retry_loop_run(spark, tmp_path)
    result = result_of(run)
    figures = chaos.summary([result])
    assert (figures["faults"], figures["premature"], figures["lost"]) == (2, 0, 0), \
        (result.premature, result.notes)
    assert (tmp_path / "failed").exists()  # the task failure was injected
    assert sorted(run.dead) == sorted(given_up(run.logged)) and run.dead
    assert run.waiting_at_restart > 0  # the query stopped with rows in the loop
