"""The central engine without sockets: plain requests in, the clock injected, replies
and steps out. Worked examples of what the server's state task relies on: min times
move at steps, every request is applied at most once, a refusal is final, a refused
background flush fails its session, a declared front holds its segment until its
deadline, and a snapshot restores all of it."""

from __future__ import annotations

from lowtide.core.messages import MinTimeUpdate, NodeTime
from lowtide.service.engine.central import CentralEngine
from lowtide.wire.messages import Error, ErrorCode, Ok
from tests.service.engine.helpers import CONFIG, SINK, SRC, Session, recv, send


def updates(engine: CentralEngine, now_ms: int) -> dict[str | None, int]:
    return {u.segment: u.time for u in engine.step(now_ms).updates}


def test_an_item_through_two_segments() -> None:
    """Front 1 feeds src from slot 10; one item is sent into src, received and turned
    into one item for the sink. Each min time moves only when its window is empty."""
    engine, agent = CentralEngine(CONFIG), Session(7)
    assert engine.handle(agent.register(1, "src", 10), now_ms=0) == Ok(1)
    assert updates(engine, 0) == {"src": 10, "sink": 10, None: 10}
    # the front's item at slot 10, then its heartbeat: nothing before 12 is left to come
    engine.handle(agent.flush(send(SRC, 10, 0xA), heartbeats=(agent.beat(1, 12),)), 1)
    assert updates(engine, 1) == {}  # the item is in flight in src
    engine.handle(agent.flush(recv(SRC, 10, 0xA), send(SINK, 10, 0xB)), 2)
    assert updates(engine, 2) == {"src": 12}  # src is empty below 12; the sink is not
    engine.handle(agent.flush(recv(SINK, 10, 0xB)), 3)
    assert updates(engine, 3) == {"sink": 12, None: 12}
    assert engine.current("sink") == MinTimeUpdate("sink", 12)
    rows = [(s["segment"], s["sent"], s["received"]) for s in engine.status_document()["segments"]]
    assert rows == [("src", 1, 1), ("sink", 1, 1)]
    assert engine.acks_applied == 4


def test_a_request_is_applied_at_most_once() -> None:
    """A resend (same session and request, after a reconnect) and a retried task's
    batch (same key, any session) are answered as duplicates and change nothing."""
    engine, driver, task, retry = CentralEngine(CONFIG), Session(1), Session(2), Session(3)
    engine.handle(driver.register(1, "src", 10), 0)
    batch = task.keyed('["q", 0, "src", 0]', send(SRC, 10, 0xA))
    assert engine.handle(batch, 1) == Ok(batch.req)
    assert engine.handle(batch, 2) == Ok(batch.req, duplicate=True)  # resent
    again = retry.keyed('["q", 0, "src", 0]', send(SRC, 10, 0xA))  # another attempt
    assert engine.handle(again, 3) == Ok(again.req, duplicate=True)
    assert engine.acks_applied == 1
    assert engine.dedup.hits == 2


def test_a_refusal_is_final_and_a_refused_flush_fails_its_session() -> None:
    """A heartbeat that goes back is refused; its resend gets the same error, never a
    duplicate's Ok (refused means never applied). It was a background flush, whose
    acks the tracker now does not know while its items may be in flight, so every
    later request of the session is refused too (fail closed)."""
    engine, agent = CentralEngine(CONFIG), Session(7)
    refused: list[object] = []
    engine.on_refused = refused.append  # the write-ahead log records refusals like this
    engine.handle(agent.register(1, "src", 10), 0)
    engine.handle(agent.flush(heartbeats=(agent.beat(1, 15),)), 0)
    back = agent.flush(heartbeats=(agent.beat(1, 12),))
    first = engine.handle(back, 1)
    assert isinstance(first, Error) and first.code == ErrorCode.NON_MONOTONIC_HEARTBEAT
    assert engine.handle(back, 2) == first
    later = engine.handle(agent.flush(send(SRC, 20, 1)), 3)
    assert isinstance(later, Error) and later.code == ErrorCode.SESSION_FAILED
    assert len(refused) == 2 and engine.acks_applied == 0
    assert engine.status()["segments"][SRC]["in_flight"] == 0  # its ack never counted


def test_a_declared_front_holds_its_segment_until_its_deadline() -> None:
    """Front 2 may still start (a producer that starts late): src waits for it from
    slot 10 while front 1 runs ahead to 50, until the declaration's 1,000 ms pass on
    the clock the engine is given (no wall clock anywhere)."""
    engine, owner, producer = CentralEngine(CONFIG), Session(8), Session(7)
    engine.handle(owner.declare(2, "src", 10, retire_after_ms=1_000), now_ms=0)
    engine.handle(producer.register(1, "src", 10), 0)
    engine.handle(producer.flush(heartbeats=(producer.beat(1, 50),)), 0)
    assert updates(engine, 0) == {"src": 10, "sink": 10, None: 10}
    assert updates(engine, 999) == {}
    assert updates(engine, 1_000) == {"src": 50, "sink": 50, None: 50}
    events = engine.status_document()["front_events"]
    assert events["retired"] == 1 and "front 2" in events["recent"][0]


def test_a_snapshot_restores_the_state_and_what_was_applied() -> None:
    engine, agent = CentralEngine(CONFIG), Session(7)
    engine.handle(agent.register(1, "src", 10), 0)
    applied = agent.keyed("k", send(SRC, 10, 0xA), heartbeats=(agent.beat(1, 20),))
    engine.handle(applied, 1)
    engine.step(1)
    meta, arrays = engine.export()
    restored = CentralEngine(CONFIG)
    restored.restore(meta, arrays)
    assert restored.status() == engine.status()
    assert restored.handle(applied, 2) == Ok(applied.req, duplicate=True)
    restored.handle(agent.flush(recv(SRC, 10, 0xA)), 3)
    assert updates(restored, 3) == {"src": 20, "sink": 20, None: 20}


def test_node_times_are_for_shards() -> None:
    """A flush with a node time was routed for a sharded deployment: a central
    tracker refuses it rather than guess (and the refusal fails the session)."""
    engine, agent = CentralEngine(CONFIG), Session(7)
    reply = engine.handle(agent.flush(send(SRC, 10, 1), node_time=NodeTime(7, 1, 10)), 0)
    assert isinstance(reply, Error) and reply.code == ErrorCode.BAD_REQUEST
