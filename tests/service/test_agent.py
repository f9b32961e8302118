"""Agent and embedded server over a real loopback socket: the service contract."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from lowtide.core.errors import AckBehindHead, NonMonotonicHeartbeat, UnknownSegment
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import Ack, AckBatch, Heartbeat, MinTimeUpdate
from lowtide.service import Agent, BatchKey, SessionFailed, TrackerService
from lowtide.service.client.base_agent import close_shared
from lowtide.service.errors import ConnectionLost, ServiceError
from tests.service.peers import HangsUpFirst

pytestmark = pytest.mark.socket


def send(segment: int, time: int, value: int) -> Ack:
    return Ack(segment, time, value, +1)


def recv(segment: int, time: int, value: int) -> Ack:
    return Ack(segment, time, value, -1)


def test_contract_end_to_end(agent: Agent) -> None:
    with agent.subscribe("sink") as sink:
        assert sink.next_update(5) == MinTimeUpdate("sink", 0)
        agent.register_front(front=1, segment="src", time=10)
        assert sink.next_update(5) == MinTimeUpdate("sink", 10)
        key = BatchKey("q", 0, "src", 0)
        batch = AckBatch.of([send(0, 10, 0xA), send(0, 11, 0xB)])
        assert agent.send_batch(key, batch, [Heartbeat(1, 12)]) is True
        assert agent.send_batch(key, batch, [Heartbeat(1, 12)]) is False  # a retry: not again
        # an operator receives both items and emits one child each into "mid" ...
        agent.add_acks(
            AckBatch.of([send(1, 10, 0xC), send(1, 11, 0xD), recv(0, 10, 0xA), recv(0, 11, 0xB)])
        )
        # ... and the sink receives them (its send acks and receive acks: rule 1)
        agent.add_acks(
            AckBatch.of([send(2, 10, 0xE), recv(1, 10, 0xC), send(2, 11, 0xF), recv(1, 11, 0xD)])
        )
        agent.add_acks(AckBatch.of([recv(2, 10, 0xE), recv(2, 11, 0xF)]))
        assert sink.wait_for(12, timeout_s=5) == MinTimeUpdate("sink", 12)
    status = agent.status()
    assert status["global_min"] == 12
    assert status["dedup_hits"] == 1


def test_updates_arrive_in_order_and_late_subscriber_gets_current(agent: Agent) -> None:
    agent.register_front(1, "src", 0)
    with agent.subscribe(None) as early:
        for t in range(1, 30):
            agent.heartbeat(1, t)
        agent.flush()
        seen = [early.next_update(5).time]
        while seen[-1] < 29:
            seen.append(early.next_update(5).time)
        assert seen == sorted(set(seen))
    with agent.subscribe("mid") as late:
        assert late.next_update(5) == MinTimeUpdate("mid", 29)


def test_submitted_batches_are_applied_in_submission_order(agent: Agent) -> None:
    """A task submits its batches and waits only at its end; they must still arrive in
    order: children's send-acks (into mid) before their parents' receipts (out of src).
    Had a receipt overtaken its children, mid would look empty and its min time would
    pass a child still in flight (then the late child is refused as behind mid's head)."""
    agent.register_front(1, "src", 1)
    with agent.subscribe("mid") as mid, agent.subscribe("src") as src:
        pending = []
        for t in range(1, 40):
            pending.append(agent.submit_batch(
                BatchKey("q", t, "src", 0), AckBatch.of([send(0, t, 0x10 + t)]),
                [Heartbeat(1, t + 1)]))
            pending.append(agent.submit_batch(
                BatchKey("q", t, "mid", 0), AckBatch.of([send(1, t, 0x100 + t)])))
            pending.append(agent.submit_batch(
                BatchKey("q", t, "src-out", 0), AckBatch.of([recv(0, t, 0x10 + t)])))
        assert all(p.wait() for p in pending)  # each applied once, none refused
        assert src.wait_for(40, 5).time == 40  # every parent received
        updates = [mid.next_update(5).time]
        with pytest.raises(TimeoutError):
            while True:
                updates.append(mid.next_update(0.3).time)
    assert max(updates) == 1  # the child of slot 1 is still in flight


def test_async_iterator_and_callback(agent: Agent) -> None:
    agent.register_front(1, "src", 0)
    got: list[MinTimeUpdate] = []
    done = threading.Event()

    def on_update(u: MinTimeUpdate) -> None:
        got.append(u)
        if u.time >= 5:
            done.set()

    cancel = agent.on_update(on_update, "sink")

    async def consume() -> list[int]:
        sub = await agent.subscribe_async("src")
        times = []
        async for u in sub:
            times.append(u.time)
            if u.time >= 5:
                sub.close()
                return times
        return times

    agent.heartbeat(1, 5)
    times = asyncio.run(asyncio.wait_for(consume(), 5))
    assert times[0] in (0, 5) and times[-1] == 5
    assert done.wait(5)
    cancel()
    assert got[0] == MinTimeUpdate("sink", 0) and got[-1] == MinTimeUpdate("sink", 5)


def test_refused_batch_changes_nothing_and_others_are_served(
    service: TrackerService, agent: Agent, graph: SegmentGraph
) -> None:
    agent.register_front(1, "src", 10, owner="producer")
    with pytest.raises(AckBehindHead):
        agent.send_batch(BatchKey("q", 1, "src", 0), AckBatch.of([send(0, 3, 0x1)]))
    with pytest.raises(UnknownSegment):
        agent.send_batch(BatchKey("q", 1, "src", 1), AckBatch.of([send(7, 12, 0x1)]))
    with Agent.connect(service.url, graph) as other, other.subscribe("sink") as sub:
        other.send_batch(BatchKey("task", 0, "src", 9), AckBatch.empty(), [Heartbeat(1, 20)],
                         owner="producer")  # another process (a Spark task) proving it
        assert sub.wait_for(20, 5).time == 20
        # the refused key was not remembered: a corrected batch under it is applied
        assert other.send_batch(BatchKey("q", 1, "src", 0), AckBatch.of([send(0, 25, 0x1)]))
    agent.heartbeat(1, 9)  # behind the front's heartbeat: the tracker refuses the flush
    with pytest.raises(NonMonotonicHeartbeat):
        agent.flush()
    with pytest.raises(SessionFailed, match="refused a background flush"):
        agent.heartbeat(1, 30)  # ... and the agent with it, from then on


def test_unknown_segment_subscription_is_refused(agent: Agent) -> None:
    with pytest.raises(UnknownSegment):
        agent.subscribe("nope")


def test_in_process_mode_has_no_socket(graph: SegmentGraph) -> None:
    svc = TrackerService.start(graph, listen=False)
    try:
        assert svc.url.startswith("inproc://")
        with svc.agent() as agent, agent.subscribe("sink") as sub:
            agent.register_front(1, "src", 7)
            assert sub.wait_for(7, 5).time == 7
    finally:
        svc.stop()


def test_many_threads_share_one_agent(agent: Agent) -> None:
    agent.register_front(1, "src", 0)
    values = np.arange(1, 4001, dtype=np.uint64)

    def work(part: np.ndarray) -> None:
        for v in part:
            agent.add_acks(AckBatch.from_columns(0, [5], [v], 1))
            agent.add_acks(AckBatch.from_columns(0, [5], [v], -1))

    threads = [threading.Thread(target=work, args=(p,)) for p in np.array_split(values, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    agent.heartbeat(1, 6)
    agent.flush()
    with agent.subscribe("src") as sub:
        assert sub.wait_for(6, 5).time == 6


def _child(url: str, spec: tuple, parent_session: int, out: multiprocessing.Queue) -> None:
    graph = SegmentGraph.of(*spec)
    inherited = Agent.shared(url, graph)  # the parent's object, as fork copied it
    ok = inherited.send_batch(BatchKey("q", 0, "src", os.getpid()), AckBatch.of([send(0, 50, 3)]))
    out.put((ok, inherited.session != parent_session))


def test_shared_agent_is_fork_safe(service: TrackerService, graph: SegmentGraph) -> None:
    parent = Agent.shared(service.url, graph)
    try:
        assert Agent.shared(service.url, graph) is parent
        parent.register_front(1, "src", 0)
        ctx = multiprocessing.get_context("fork")
        out: multiprocessing.Queue = ctx.Queue()
        spec = (("src", ()), ("mid", ("src",)), ("sink", ("mid",)))
        proc = ctx.Process(target=_child, args=(service.url, spec, parent.session, out))
        proc.start()
        try:
            assert out.get(timeout=20) == (True, True)
        finally:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        assert parent.status()["acks_applied"] == 1
    finally:
        parent.close()


def test_stopping_a_tracker_closes_this_process_s_shared_agents(graph: SegmentGraph) -> None:
    """A shared agent outliving its tracker dialled the dead port every second; when a
    Spark worker's callback socket took that port, Spark read our frame's length as
    its own and ran out of heap (a CI run). The tracker takes them along."""
    service = TrackerService.start(graph)
    try:
        agent = Agent.shared(service.url, graph)
        agent.register_front(1, "src", 0)
    finally:
        service.stop()
    assert not agent._thread.is_alive()
    assert agent._loop.is_closed()
    with pytest.raises(ConnectionLost, match="was closed"):  # one line, not a closed loop's
        agent.heartbeat(1, 5)
    assert Agent.shared(service.url, graph) is not agent  # a new one (that cannot connect)
    close_shared(service.url)


def test_closing_shared_agents_flushes_what_they_buffered(
    service: TrackerService, graph: SegmentGraph
) -> None:
    agent = Agent.shared(service.url, graph)
    agent.register_front(1, "src", 0)
    agent.add_acks(AckBatch.of([send(0, 5, 7)]))
    close_shared(service.url)
    assert not agent._thread.is_alive()
    assert agent._loop.is_closed()  # else it warns "unclosed event loop" when collected
    assert service.status()["acks_applied"] == 1


def test_a_failing_state_step_fails_the_tracker_loudly_not_silently(
    service: TrackerService, agent: Agent, graph: SegmentGraph, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: a bug in a step must not leave a dead state task behind (every
    request would then hang until its caller's timeout), nor may the tracker confirm
    anything after it (the step may be half applied or unlogged): every request,
    from this client or a new one, is refused at once with the reason."""
    engine = service.server.engine
    assert engine is not None

    def broken(msg, now):  # type: ignore[no-untyped-def]
        raise RuntimeError("injected bug")

    monkeypatch.setattr(engine, "handle", broken)
    t0 = time.monotonic()
    with pytest.raises(ServiceError, match="injected bug"):
        agent.register_front(1, "src", 10, timeout_s=20)
    with pytest.raises(ServiceError, match="the tracker failed"):
        agent.send_batch(BatchKey("q", 0, "src", 0), AckBatch.of([send(0, 10, 0xA)]),
                         timeout_s=20)
    with Agent.connect(service.url, graph) as other, pytest.raises(ServiceError, match="injected"):
        other.flush(timeout_s=20)
    assert time.monotonic() - t0 < 15  # answers, not timeouts


def test_a_timeout_says_what_the_connection_is_doing(graph: SegmentGraph) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with (
        Agent.connect(f"tcp://127.0.0.1:{port}", graph, connect_timeout_s=0.2) as a,
        pytest.raises(TimeoutError, match="not connected, 0 connections, last error"),
    ):
        a.register_front(1, "src", 10, timeout_s=1.0)


def test_caller_agent_runs_its_loop_in_the_calling_thread(
    service: TrackerService, graph: SegmentGraph
) -> None:
    """Spark tasks use a CallerAgent: no thread of its own, the same contract for
    calls; a submitted batch goes out at once (the tracker applies it while the caller
    does other work), and what needs an always-running loop is not there."""
    from lowtide.service import CallerAgent

    threads = threading.active_count()
    agent = CallerAgent.connect(service.url, graph)
    try:
        assert threading.active_count() == threads
        agent.register_front(1, "src", 10)
        key = BatchKey("q", 0, "src", 0)
        assert agent.send_batch(key, AckBatch.of([send(0, 10, 0xA)]), [Heartbeat(1, 11)])
        assert agent.send_batch(key, AckBatch.of([send(0, 10, 0xA)])) is False  # a retry
        pending = agent.submit_batch(BatchKey("q", 0, "mid", 0),
                                     AckBatch.of([send(1, 10, 0xB), recv(0, 10, 0xA)]))
        with Agent.connect(service.url, graph) as watcher, watcher.subscribe("src") as src:
            assert src.wait_for(11, 5).time == 11  # applied before anyone waited for it
        assert pending.wait() is True
        assert agent.status()["global_min"] == 10
        # buffered acks, heartbeats and subscriptions are Agent's alone: not inherited
        # to be refused, simply absent
        for method in ("add_acks", "heartbeat", "subscribe", "subscribe_async", "on_update"):
            assert hasattr(Agent, method) and not hasattr(agent, method)
    finally:
        agent.close()
    assert threading.active_count() == threads


def test_a_ready_caller_agent_sends_from_the_calling_thread_and_runs_its_loop_to_wait(
    service: TrackerService, graph: SegmentGraph
) -> None:
    """Once its agent is ready, a Spark task's keyed batch and its question for a min
    time are written by the task's own thread, and the loop runs only while it waits
    for the replies: no asyncio task per call (each cost a task several turns of the
    loop; submit and wait took twice the CPU)."""
    from lowtide.service import CallerAgent
    from lowtide.wire.messages import LATEST_MS

    agent = CallerAgent.connect(service.url, graph)
    try:
        agent.register_front(1, "src", 10)  # ready: the first call waited for the Welcome
        created: list[object] = []
        create_task = agent._loop.create_task
        agent._loop.create_task = lambda coro, **kw: created.append(coro) or create_task(
            coro, **kw)  # type: ignore[method-assign]
        key = BatchKey("q", 0, "src", 0)
        assert agent.send_batch(key, AckBatch.of([send(0, 10, 0xA)]), [Heartbeat(1, 12)])
        assert agent.send_batch(key, AckBatch.of([send(0, 10, 0xA)])) is False  # a retry
        assert agent.ask_min_time_at("src", LATEST_MS).wait() == 10  # 0xA is in flight
        assert created == []
    finally:
        agent.close()


def test_a_caller_agents_call_times_out_from_when_it_was_sent(
    service: TrackerService, graph: SegmentGraph, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tracker that does not answer a task's batch: ``wait()`` raises once the
    timeout passed since the submit, with the connection's state, and the agent still
    serves the next call."""
    from lowtide.service import CallerAgent
    from lowtide.service.server.tracker_server import TrackerServer
    from lowtide.wire.messages import Batch

    dispatch = TrackerServer._dispatch

    def deaf(server: TrackerServer, peer: object, msg: object, now: int, out: list) -> None:
        if not isinstance(msg, Batch):
            dispatch(server, peer, msg, now, out)

    agent = CallerAgent.connect(service.url, graph)
    try:
        agent.register_front(1, "src", 10)
        monkeypatch.setattr(TrackerServer, "_dispatch", deaf)
        pending = agent.submit_batch(BatchKey("q", 0, "src", 0),
                                     AckBatch.of([send(0, 10, 0xA)]), timeout_s=0.5)
        time.sleep(0.6)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"within 0.5 s \(tcp://.*: connected"):
            pending.wait()
        assert time.monotonic() - started < 0.3
        monkeypatch.undo()
        assert agent.send_batch(BatchKey("q", 1, "src", 0), AckBatch.of([send(0, 11, 0xB)]))
        assert agent.status()["global_min"] == 10
    finally:
        agent.close()


def test_a_workers_agent_of_a_tracker_it_no_longer_uses_is_closed_for_the_next(
    graph: SegmentGraph, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Spark worker outlives pipelines: each new tracker's CallerAgent stayed for ever
    (its loop and state walked by every task's garbage collection). Making another
    closes the ones unused for ``IDLE_S``, at once (a gone tracker's agent has nothing
    to flush); the ones in use stay."""
    from lowtide.service import CallerAgent

    first, second, third = (TrackerService.start(graph, port=0) for _ in range(3))
    try:
        old = CallerAgent.shared(first.url, graph)
        busy = CallerAgent.shared(second.url, graph)
        old.register_front(1, "src", 10)
        # as in a worker, whose tracker runs in another process: stopping it leaves
        # the worker's agent behind
        monkeypatch.setattr("lowtide.service.deploy.embedded.close_shared", lambda url: None)
        first.stop()
        assert not old._closed
        monkeypatch.setattr(CallerAgent, "IDLE_S", 0.5)
        time.sleep(0.6)
        busy.status()  # used just now
        started = time.monotonic()
        new = CallerAgent.shared(third.url, graph)
        assert time.monotonic() - started < 1.0
        assert old._closed and not busy._closed
        assert {a.url for a in CallerAgent._shared.values()} >= {second.url, third.url}
        assert first.url not in {a.url for a in CallerAgent._shared.values()}
        assert new.status()["global_min"] >= 0 and busy.status()
    finally:
        close_shared()
        for svc in (second, third):
            svc.stop()


def test_requests_issued_together_are_one_write_each_way(
    service: TrackerService, graph: SegmentGraph, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Spark task's receipts and its question for the min time behind them, issued
    together: the tracker reads both at one wake-up (one group of its state task),
    applies the batch before it answers, and replies to both in one write. A send costs
    the tracker about 0.2 ms on a loaded 2-core machine."""
    from lowtide.service import CallerAgent, net
    from lowtide.service.server.tracker_server import TrackerServer
    from lowtide.wire.messages import LATEST_MS

    groups: list[list[str]] = []
    writes: list[int] = []
    run_group, write = TrackerServer._run_group, net.StreamChannel._write

    def recorded(server: TrackerServer, items: list) -> None:
        groups.append([type(getattr(i, "msg", i)).__name__ for i in items])
        run_group(server, items)

    def counted(channel: net.StreamChannel, payloads: list[bytes]) -> None:
        if threading.current_thread() is service._thread:
            writes.append(len(payloads))
        write(channel, payloads)

    monkeypatch.setattr(TrackerServer, "_run_group", recorded)
    monkeypatch.setattr(net.StreamChannel, "_write", counted)
    agent = CallerAgent.connect(service.url, graph)
    try:
        agent.register_front(1, "src", 10)
        agent.send_batch(BatchKey("q", 0, "src", 0), AckBatch.of([send(0, 10, 0xA)]),
                         [Heartbeat(1, 12)])
        groups.clear()
        writes.clear()
        with agent.together():
            receipts = agent.submit_batch(BatchKey("q", 0, "<receive>src", 0),
                                          AckBatch.of([recv(0, 10, 0xA)]))
            stamp = agent.ask_min_time_at("src", LATEST_MS)
        assert receipts.wait() is True and stamp.wait() == 12  # the receipts are in it
        assert ["Batch", "MinTimeAt"] in groups and writes == [2]
    finally:
        agent.close()


def test_caller_agent_reconnects_to_a_restarted_tracker_between_calls(
    graph: SegmentGraph, tmp_path
) -> None:
    """Between calls nobody runs a CallerAgent's loop: a tracker that restarted
    meanwhile is found gone at the next call, which reconnects and is answered."""
    from lowtide.service import CallerAgent

    svc = TrackerService.start(graph, state_dir=tmp_path, port=0)
    port = svc.url.rsplit(":", 1)[1]
    agent = CallerAgent.connect(svc.url, graph)
    try:
        agent.register_front(1, "src", 10)
        svc.stop()
        svc = TrackerService.start(graph, state_dir=tmp_path, port=int(port))
        key = BatchKey("q", 1, "src", 0)
        assert agent.send_batch(key, AckBatch.of([send(0, 10, 0xA)]), timeout_s=10) is True
        assert agent.status()["global_min"] == 10
    finally:
        agent.close()
        svc.stop()


def test_an_idle_agent_of_a_stopped_tracker_dials_again_only_once_used(
    graph: SegmentGraph
) -> None:
    """An agent with nothing to send redialled a stopped tracker's port every second for
    ever; when a Spark worker's callback socket took that port, Spark read our Hello's
    length as a 1 GiB string (a CI run's OutOfMemoryError). Now it dials once it is used."""
    import socket

    service = TrackerService.start(graph, port=0)
    port = int(service.url.rsplit(":", 1)[1])
    agent = Agent.connect(service.url, graph)
    try:
        agent.status()
        service.stop()
        with socket.create_server(("127.0.0.1", port)) as other:  # another program's port
            other.settimeout(3.0)
            with pytest.raises(TimeoutError):
                other.accept()
            threading.Thread(target=lambda: _quietly(agent.status), daemon=True).start()
            conn, _ = other.accept()  # used: it dials again
            conn.close()
    finally:
        agent.close()


def _quietly(call: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):  # the port is not a tracker's: the call fails
        call()


def test_an_agent_started_before_its_tracker_connects_once_it_is_up(
    graph: SegmentGraph
) -> None:
    """Idle connections dial again only when used; an agent waiting for its first
    Welcome is using its connection, so it keeps dialling until its tracker is up."""
    import socket

    with socket.socket() as probe:  # a free port for the tracker to come
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agents: list[Agent] = []
    starting = threading.Thread(target=lambda: agents.append(
        Agent.connect(f"tcp://127.0.0.1:{port}", graph)), daemon=True)
    starting.start()
    time.sleep(1.5)  # its first dials are refused
    service = TrackerService.start(graph, port=port)
    try:
        starting.join(30)
        assert agents, "the agent never connected"
        assert "global_min" in agents[0].status()
    finally:
        for agent in agents:
            agent.close()
        service.stop()


@pytest.mark.parametrize("kind", ["Agent", "CallerAgent"])  # a Spark task's: CallerAgent
def test_an_agent_whose_first_handshake_is_cut_dials_again_for_a_front_operation(
    service: TrackerService, graph: SegmentGraph, kind: str
) -> None:
    """A front operation waits for the first Welcome before it sends anything, and a
    lost connection with nothing to send waited to be used: an agent whose first
    connection was cut in its handshake never dialled again ("not connected, 0
    connections", CI, when the admission gate dropped it for a burst of peers)."""
    from lowtide.service import CallerAgent

    proxy = HangsUpFirst(service.url)
    try:
        with {"Agent": Agent, "CallerAgent": CallerAgent}[kind].connect(proxy.url, graph) as agent:
            agent.register_front(1, "src", 5, timeout_s=5)
            assert agent.status()["global_min"] == 5
    finally:
        proxy.close()
    assert proxy.hung_up == 1


def test_closing_an_agent_ends_a_call_that_waits_on_it(
    graph: SegmentGraph, caplog: pytest.LogCaptureFixture
) -> None:
    """A thread's call still waiting when another closes the agent (a producer's flush
    during a tracker outage) ends with a one-line ConnectionLost, not a hang, and
    asyncio reports no task destroyed pending or error never retrieved."""
    import gc
    import socket

    with socket.socket() as s:  # a port nobody listens on: the call waits to connect
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    a = Agent.connect(f"tcp://127.0.0.1:{port}", graph, connect_timeout_s=0.2)
    ended: list[BaseException] = []

    def flush() -> None:
        try:
            a.flush(timeout_s=30.0)
        except BaseException as exc:  # what the caller sees, whatever it is
            ended.append(exc)

    waiter = threading.Thread(target=flush, daemon=True)
    waiter.start()
    time.sleep(0.3)
    with caplog.at_level("ERROR", logger="asyncio"):
        a.close(timeout_s=0.5)
        waiter.join(5.0)
        gc.collect()
    assert not waiter.is_alive()
    assert len(ended) == 1 and isinstance(ended[0], ConnectionLost), ended
    assert "closed" in str(ended[0])
    assert not [r for r in caplog.records if r.name == "asyncio"]
