"""Subscriptions: late subscribers get the current min time first; routing order."""

from __future__ import annotations

from lowtide.core.messages import MinTimeUpdate
from lowtide.core.subscriptions import Subscriptions


def test_subscribe_returns_the_current_update() -> None:
    subs = Subscriptions()
    assert subs.subscribe(1, "sink", current=MinTimeUpdate("sink", 40)) == MinTimeUpdate("sink", 40)
    assert subs.subscribe(2, None, current=MinTimeUpdate(None, 30)) == MinTimeUpdate(None, 30)
    assert len(subs) == 2


def test_route_in_update_order_then_subscriber_id() -> None:
    subs = Subscriptions()
    for sub, seg in [(5, "a"), (2, "a"), (9, None), (3, "b"), (1, None)]:
        subs.subscribe(sub, seg, current=MinTimeUpdate(seg, 0))
    updates = [
        MinTimeUpdate("b", 7),
        MinTimeUpdate("a", 8),
        MinTimeUpdate("c", 1),
        MinTimeUpdate(None, 7),
    ]
    assert subs.route(updates) == [
        (3, MinTimeUpdate("b", 7)),
        (2, MinTimeUpdate("a", 8)),
        (5, MinTimeUpdate("a", 8)),
        (1, MinTimeUpdate(None, 7)),
        (9, MinTimeUpdate(None, 7)),
    ]
    assert subs.route([]) == []


def test_subscribing_twice_is_once() -> None:
    subs = Subscriptions()
    subs.subscribe(1, "a", current=MinTimeUpdate("a", 0))
    subs.subscribe(1, "a", current=MinTimeUpdate("a", 0))
    assert len(subs) == 1
    assert subs.route([MinTimeUpdate("a", 1)]) == [(1, MinTimeUpdate("a", 1))]


def test_unsubscribe_one_segment_or_everywhere() -> None:
    subs = Subscriptions()
    for seg in ("a", "b", None):
        subs.subscribe(1, seg, current=MinTimeUpdate(seg, 0))
        subs.subscribe(2, seg, current=MinTimeUpdate(seg, 0))
    subs.unsubscribe(1, "a")
    assert subs.route([MinTimeUpdate("a", 1)]) == [(2, MinTimeUpdate("a", 1))]
    subs.unsubscribe(2, everywhere=True)
    assert len(subs) == 2
    assert subs.route([MinTimeUpdate("a", 2), MinTimeUpdate("b", 2), MinTimeUpdate(None, 2)]) == [
        (1, MinTimeUpdate("b", 2)),
        (1, MinTimeUpdate(None, 2)),
    ]
    subs.unsubscribe(1, None)
    subs.unsubscribe(7, "never")  # unknown: nothing to do
    assert subs.route([MinTimeUpdate(None, 3)]) == []
    assert len(subs) == 1
