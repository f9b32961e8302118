"""What a query's driver tells the tracker about its batches (issue 34 point 3), from
successive polls of Spark's ``status`` and ``lastProgress``: no Spark needed."""

from __future__ import annotations

from pathlib import Path

from lowtide.spark.pipeline.batches import BatchWatch, first_batch
from lowtide.wire.messages import BatchState

OPEN, CLOSED = BatchState.OPEN, BatchState.CLOSED
RUNNING = {"isTriggerActive": True, "isDataAvailable": True}
PLANNING = {"isTriggerActive": True, "isDataAvailable": False}
IDLE = {"isTriggerActive": False, "isDataAvailable": False}


def test_a_batch_is_opened_kept_alive_and_closed_once() -> None:
    said: list[tuple[int, BatchState]] = []
    watch = BatchWatch(lambda b, s: said.append((b, s)), first=0, keepalive_s=1.0)
    watch.poll(PLANNING, None, 0.0)  # looking for data: no batch yet
    watch.poll(RUNNING, None, 0.1)  # batch 0 runs
    watch.poll(RUNNING, None, 0.6)
    watch.poll(RUNNING, None, 1.2)  # still running: said again
    watch.poll(IDLE, 0, 1.3)  # done
    watch.poll(IDLE, 0, 1.5)
    assert said == [(0, OPEN), (0, OPEN), (0, CLOSED)]


def test_the_first_batch_is_open_from_before_the_query_starts() -> None:
    said: list[tuple[int, BatchState]] = []
    watch = BatchWatch(lambda b, s: said.append((b, s)), first=58)
    watch.starting(0.0)  # announced before writeStream.start()
    watch.poll(IDLE, None, 0.5)  # initialising sources: still open
    watch.poll(IDLE, None, 1.0)
    watch.poll(RUNNING, None, 1.5)
    watch.poll(IDLE, 58, 2.0)
    assert said == [(58, OPEN), (58, OPEN), (58, CLOSED)]


def test_batches_too_short_to_see_still_move_the_last_closed_one() -> None:
    said: list[tuple[int, BatchState]] = []
    watch = BatchWatch(lambda b, s: said.append((b, s)), first=0)
    watch.poll(RUNNING, 3, 0.0)  # batch 4 runs
    watch.poll(RUNNING, 6, 0.2)  # 4, 5, 6 done between polls; 7 runs
    assert said == [(3, CLOSED), (4, OPEN), (6, CLOSED), (7, OPEN)]


def test_a_restarted_query_starts_after_its_checkpoint(tmp_path: Path) -> None:
    assert first_batch(None) == 0 and first_batch(str(tmp_path)) == 0
    (tmp_path / "offsets").mkdir()
    for name in ("0", "1", "57", ".57.crc"):
        (tmp_path / "offsets" / name).write_text("")
    assert first_batch(str(tmp_path)) == 58
