"""Honest stuck reports (issue 34 point 3): a window a running batch may still deliver
is waiting, not missing; a real loss is still reported once those batches are done.

Worked example throughout: ``src -> sink``, windows of 1 slot, threshold 1 s. Item A
(slot 10) is sent into ``sink`` by the source and the front heartbeats past it: from
then on the sink's window [10, 11) is overdue. Query ``q`` acks into both segments and
reports its batches.
"""

from __future__ import annotations

from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import Ack, AckBatch, Heartbeat, RegisterFront
from lowtide.core.open_batches import STARTING, QueryBatches, Waiting
from lowtide.core.tracker import Tracker, TrackerConfig

THRESHOLD_MS = 1_000
SEGMENTS = ("src", "sink")
A, A1 = 0xA0, 0xA1


def overdue_item(tr: Tracker) -> None:
    """A (slot 10) went through src into sink; the front passed it."""
    tr.register_front(RegisterFront(1, "src", 10))
    tr.apply(AckBatch.of([Ack(0, 10, A, 1)]))
    tr.apply(AckBatch.of([Ack(1, 10, A1, 1), Ack(0, 10, A, -1)]))
    tr.heartbeat(Heartbeat(1, 20))


def tracker() -> Tracker:
    graph = SegmentGraph.of(("src", ()), ("sink", ("src",)))
    return TrackerConfig(graph, stuck_after_ms=THRESHOLD_MS, stuck_check_ms=100).build()


def run(tr: Tracker, start: int, end: int, running: int | None = None) -> list[int]:
    """Step every 100 ms; when each (fresh) stuck report came. ``running``: q's driver
    says every second that this batch still runs (its keep-alive)."""
    fresh = []
    for now in range(start, end, 100):
        if running is not None and now % 1_000 == 0:
            tr.batches.open("q", running, SEGMENTS, now)
        fresh += [now for _s in tr.step(now).stuck]
    return fresh


def test_without_batch_reports_the_threshold_counts_from_the_overdue_time() -> None:
    tr = tracker()
    overdue_item(tr)
    assert run(tr, 0, 3_000) == [1_000]  # today's behaviour: no query said anything


def test_a_slow_batch_forty_times_the_threshold_is_waiting_not_missing() -> None:
    tr = tracker()
    tr.batches.open("q", 3, SEGMENTS, now_ms=0)  # batch 3 is running when A is overdue
    overdue_item(tr)
    assert run(tr, 0, 40_000, running=3) == []  # NO FALSE LOSS: batch 3 runs for 40 s
    (waiting,) = tr.waiting()
    assert waiting.waiting == Waiting("q", 3, 39_900)
    assert waiting.describe() == ("segment 'sink', slots [10, 11): 1 item(s) not yet "
                                  "received, waiting for query q batch 3, running 40 s")
    assert tr.stuck() == []
    tr.batches.close("q", 3, 40_000)
    tr.batches.open("q", 4, SEGMENTS, 40_000)  # planned after A was written: may read it
    assert run(tr, 40_000, 80_000, running=4) == []
    assert tr.waiting()[0].waiting.batch == 4
    tr.apply(AckBatch.of([Ack(1, 10, A1, -1)]))  # batch 4 delivers A1
    tr.batches.close("q", 4, 80_000)
    assert run(tr, 80_000, 85_000) == [] and tr.waiting() == []
    assert tr.min_time("sink") == 20


def test_a_real_loss_is_reported_once_the_batches_that_could_deliver_it_closed() -> None:
    tr = tracker()
    tr.batches.open("q", 3, SEGMENTS, now_ms=0)
    overdue_item(tr)  # A1 is lost: batches 3 and 4 close without it
    assert run(tr, 0, 5_000) == []
    tr.batches.close("q", 3, 5_000)
    tr.batches.open("q", 4, SEGMENTS, 5_000)
    tr.batches.close("q", 4, 5_500)
    # later batches keep running, each shorter than the threshold: they cannot hold it
    for b, at in ((5, 5_500), (6, 6_000), (7, 6_500)):
        tr.batches.open("q", b, SEGMENTS, at)
        tr.batches.close("q", b, at + 400)
    assert run(tr, 5_000, 8_000) == [6_500]  # 1 s after batch 4, the last that could, closed
    (stuck,) = tr.stuck()
    assert stuck.describe() == "segment 'sink', slots [10, 11): 1 item(s) missing"


def test_an_idle_query_whose_next_batch_never_comes_still_reports_the_loss() -> None:
    tr = tracker()
    tr.batches.open("q", 3, SEGMENTS, 0)
    tr.batches.close("q", 3, 10)  # idle: batch 4 would read A1, it never starts
    overdue_item(tr)
    assert run(tr, 100, 3_000) == [1_100]


def test_a_query_that_acks_elsewhere_or_whose_driver_died_holds_nothing() -> None:
    tr = tracker()
    tr.batches.open("other", 1, ("src",), 0)  # another query, not acking into sink
    overdue_item(tr)
    assert run(tr, 0, 2_000) == [1_000]
    tr = TrackerConfig(tr.graph, stuck_after_ms=THRESHOLD_MS, stuck_check_ms=100,
                       batch_forget_ms=2_000).build()
    tr.batches.open("q", 3, SEGMENTS, 0)  # its driver never says anything again
    overdue_item(tr)
    assert run(tr, 0, 4_000) == [2_100]  # forgotten after 2 s: counted from the overdue time


def test_limits_count_batches_in_the_order_they_were_reported() -> None:
    batches = QueryBatches()
    assert batches.limits("sink") == {}
    batches.open("q", STARTING, ("sink",), 0)  # announced before the query started
    assert batches.limits("sink") == {"q": 1}  # it, or the batch after it
    batches.open("q", 57, ("sink",), 10)  # restarted from its checkpoint: ids jump
    assert batches.holding("sink", {"q": 1}, 1_010) == Waiting("q", STARTING, 1_010)
    assert Waiting("q", STARTING, 1_010).describe() == ("waiting for query q starting, "
                                                        "running 1 s")
    batches.close("q", 57, 2_000)  # the announced one is closed with it (a close we missed)
    assert batches.holding("sink", {"q": 1}, 2_000) is None
    assert batches.released_ms("sink", {"q": 1}) == 2_000
    assert batches.limits("sink") == {"q": 2} and not batches.busy("sink")
    batches.open("q", 58, ("sink",), 2_100)
    batches.open("q", 58, ("sink",), 2_900)  # a keep-alive: the first time counts
    assert batches.busy("sink") and not batches.busy("src")
    assert batches.holding("sink", {"q": 2}, 3_000) == Waiting("q", 58, 900)
    assert batches.recent_ms() == 1_990  # batch 57 took 1.99 s: what an ETA adds
    batches.stopped("q")
    assert batches.limits("sink") == {}
