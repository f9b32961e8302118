"""``lowtide bench chaos --spark``'s speculative and driver-window fault kinds on
the shared session: task failures before the window and after its changelog step (or,
with the step on the driver, the sink failing after the step's acks went out), a
lagging front and a restart from the checkpoint find nothing premature and nothing
lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from lowtide.bench import chaos

pytestmark = pytest.mark.spark


@pytest.mark.slow  # ~1-5 min each; the same faults by default: test_speculative_e2e.py
@pytest.mark.parametrize("on_driver", [False, True], ids=["keyed-step", "driver-step"])
def test_a_speculative_window_under_failures_and_a_restart(spark, tmp_path: Path,
                                                           on_driver: bool) -> None:
    from lowtide.bench.chaos.speculative_fault import result_of, speculative_run

    run = speculative_run(spark, tmp_path, on_driver=on_driver)
    result = result_of(run)
    figures = chaos.summary([result])
    assert (figures["premature"], figures["lost"]) == (0, 0), (result.premature, result.notes)
    assert (run.rows["op"] == "tombstone").any()  # early versions were replaced
    assert run.rows["batch"].nunique() > 3 and run.claimed_ms > run.t0
    if on_driver:
        assert run.reruns >= 1  # the batch whose sink failed ran again


@pytest.mark.slow  # ~1-2 min each; the same faults by default: test_key_ranges_e2e.py
@pytest.mark.parametrize("key_ranges", [4, 0], ids=["key-ranges", "whole-window"])
def test_a_window_on_the_driver_under_failures_and_a_restart(
        spark, tmp_path: Path, key_ranges: int) -> None:
    from lowtide.bench.chaos.ranges_fault import ranges_run

    result = ranges_run(spark, tmp_path, key_ranges=key_ranges)
    figures = chaos.summary([result])
    assert (figures["premature"], figures["lost"]) == (0, 0), (result.premature, result.notes)
    assert "batches written again" in result.notes[0] and " 0 batches" not in result.notes[0]
