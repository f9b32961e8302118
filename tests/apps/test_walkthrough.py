"""The walkthrough reports exactly the item it loses, whatever the lagging front's
delay (the README's line is checked in tests/cli/test_cli_output.py)."""

from __future__ import annotations

import contextlib
import io

import pytest

from lowtide.apps import walkthrough


@pytest.mark.parametrize("lag_ms", [0, 20, 300, 1000, 2000])
def test_one_lost_item_is_the_only_stuck_window(lag_ms: int) -> None:
    seconds = walkthrough.seconds_to_report(2000, lag_ms)
    with contextlib.redirect_stdout(io.StringIO()):
        figures = walkthrough.run(seconds, lag_ms, 2000)
    (stuck,) = figures["stuck"]
    assert stuck.startswith("segment 'parse'") and stuck.endswith(": 1 item(s) missing")


def test_without_a_loss_nothing_is_stuck() -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        figures = walkthrough.run(walkthrough.seconds_to_report(-1, 1000), 1000, None)
    assert figures["stuck"] == []
