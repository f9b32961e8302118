"""A standby tracker (rule 18): two ``lowtide serve --ha`` processes share a step log in
a real Kafka broker. ``kill -9`` the leader under running producers, a consumer and a
subscriber: the standby takes over with every confirmed batch and every open hold, the
min times never go back, nothing is premature (a held item keeps the sink down across
the takeover), and the agents find the new leader by themselves. A paused leader that
wakes after the takeover is fenced: it confirms nothing more, says so in one line and
lets its clients go. Skipped, with the reason, without java and the broker jars.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from lowtide.apps.kafka_broker import KafkaBroker
from lowtide.core.messages import Heartbeat, MinTimeUpdate
from lowtide.service import Agent, BatchKey, ServerConfig, TrackerService
from lowtide.service.channel import InprocChannel, tracker_urls
from lowtide.service.errors import ConnectionLost, ServiceError
from lowtide.service.ha.config import HaConfig
from lowtide.service.ha.leader_log import LeadLost
from lowtide.service.server.fail_stop import FailStop
from lowtide.service.server.inbox import Admit, Peer, Request
from lowtide.service.server.metrics import ServerMetrics
from lowtide.wire.messages import WIRE_VERSION, Batch, ErrorCode, Hello, Role
from tests.service.procs import (
    FRONT_OWNER,
    ServerProcess,
    consumer,
    finish_held,
    graph,
    produced,
    producer,
    serve,
    stop_processes,
    wait_until,
    write_graph,
)

pytestmark = pytest.mark.socket

SLOTS = 12
HELD = 6  # front 0's slot whose sink receive waits until after the takeover
FRONTS = (0, 1)
LEASE_S = 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def group_args(tmp: Path, broker: KafkaBroker, group: str, port: int) -> tuple[str, ...]:
    return ("--ha", f"kafka://{broker.bootstrap}/{group}", "--lease-s", str(LEASE_S),
            "--graph", str(write_graph(tmp)), "--port", str(port))


def test_kill9_leader_standby_takes_over(tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    ctx = multiprocessing.get_context("spawn")
    holding, release = ctx.Event(), ctx.Event()
    group, ports = f"t-{uuid.uuid4().hex[:8]}", (free_port(), free_port())
    urls = ",".join(f"tcp://127.0.0.1:{p}" for p in ports)
    seen: list[MinTimeUpdate] = []
    procs: list[multiprocessing.process.BaseProcess] = []
    with serve(tmp_path, *group_args(tmp_path, kafka_broker, group, ports[0]),
               standby=True) as first:
        first.wait_serving(30)
        with serve(tmp_path, *group_args(tmp_path, kafka_broker, group, ports[1]),
                   standby=True) as second:
            watcher = Agent.connect(urls, graph())
            try:
                for front in FRONTS:
                    watcher.register_front(front, "src", 1, owner=FRONT_OWNER)
                watcher.on_update(seen.append, "sink")
                procs = [ctx.Process(target=producer, args=(urls, f, SLOTS)) for f in FRONTS]
                procs.append(ctx.Process(target=consumer, args=(
                    urls, FRONTS, SLOTS, (0, HELD), holding, release)))
                for p in procs:
                    p.start()
                wait_until(lambda: seen and seen[-1].time >= 3, 60)
                first.kill9()  # agents are in the middle of sending
                killed, before_kill = time.monotonic(), seen[-1].time
                second.wait_serving(30)
                failover_s = time.monotonic() - killed
                assert failover_s < LEASE_S + 10  # the lease, the fencing, the catch-up
                _finish(urls, procs, holding, release, before_kill, seen)
                assert '"event": "leading"' in second.log()
            finally:
                stop_processes(procs)
                watcher.close()


def _finish(urls: str, procs: list[multiprocessing.process.BaseProcess], holding: Any,
            release: Any, before_kill: int, seen: list[MinTimeUpdate]) -> None:
    assert seen[-1].time >= before_kill
    status = finish_held(urls, procs, holding, release, HELD, SLOTS, seen)
    assert status["ha"]["role"] == "leader" and status["ha"]["epoch"] == 2


@pytest.mark.slow  # ~11 s; a failover by default: the kill -9 test above
def test_paused_leader_wakes_fenced(tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    group, ports = f"t-{uuid.uuid4().hex[:8]}", (free_port(), free_port())
    urls = ",".join(f"tcp://127.0.0.1:{p}" for p in ports)
    with serve(tmp_path, *group_args(tmp_path, kafka_broker, group, ports[0]),
               standby=True) as first:
        first.wait_serving(30)
        with serve(tmp_path, *group_args(tmp_path, kafka_broker, group, ports[1]),
                   standby=True) as second, Agent.connect(urls, graph()) as agent:
            agent.register_front(0, "src", 1)
            assert agent.send_batch(BatchKey("q", 1, "src", 0), produced(0, 1),
                                    [Heartbeat(0, 2)]) is True
            os.kill(first.proc.pid, signal.SIGSTOP)  # partitioned: alive, silent
            with ThreadPoolExecutor(1) as pool:
                try:  # sent to the paused leader, which reads it only once fenced
                    sent = pool.submit(agent.send_batch, BatchKey("q", 2, "src", 0),
                                       produced(0, 2), [Heartbeat(0, 3)], timeout_s=60)
                    second.wait_serving(30)
                finally:
                    os.kill(first.proc.pid, signal.SIGCONT)
                _fenced(first)
                # neither confirmed nor refused by the fenced leader: the agent resent it
                # to the new one, which has everything the old one confirmed
                assert sent.result(60) is True
            assert agent.send_batch(BatchKey("q", 1, "src", 0), produced(0, 1)) is False
            status = agent.status()
            assert status["ha"] == {"role": "leader", "epoch": 2, "log": status["ha"]["log"]}
            assert status["pid"] == second.proc.pid
            shown = subprocess.run([sys.executable, "-m", "lowtide.cli", "status", "--once",
                                    "--url", urls], capture_output=True, text=True, timeout=60)
            assert f"leader of kafka://{kafka_broker.bootstrap}/{group}, epoch 2" in shown.stdout


def _fenced(old: ServerProcess) -> None:
    """The woken leader learns at its next heartbeat: one line, exit 4, no traceback."""
    assert old.proc.wait(30) == 4
    log = old.log()
    assert log.count('"event": "stopped leading"') == 1
    assert "fenced" in log and "Traceback" not in log


def test_a_client_tries_the_next_address() -> None:
    """No Kafka: the first address serves nothing (a standby listens on nothing), the
    agent finds the second, and a subscription follows it there."""
    svc = TrackerService.start(graph())
    try:
        urls = f"tcp://127.0.0.1:{free_port()},{svc.url}"
        with Agent.connect(urls, graph()) as agent, agent.subscribe("src") as sub:
            agent.register_front(0, "src", 1)
            assert agent.send_batch(BatchKey("q", 1, "src", 0), produced(0, 1),
                                    [Heartbeat(0, 2)]) is True
            assert sub.wait_for(1, timeout_s=10).time >= 1
    finally:
        svc.stop()


def test_group_options_refused_early() -> None:
    with pytest.raises(ValueError, match="kafka://HOST:PORT/GROUP"):
        HaConfig.parse("tcp://127.0.0.1:9092/g")
    with pytest.raises(ValueError, match="letters, digits"):
        HaConfig.parse("kafka://127.0.0.1:9092/a b")
    with pytest.raises(ValueError, match="drop --state-dir"):
        ServerConfig(ha=HaConfig("127.0.0.1:9092", "g"), state_dir=Path("x"))
    assert tracker_urls("tcp://a:1, tcp://b:2") == ["tcp://a:1", "tcp://b:2"]
    with pytest.raises(ValueError, match="tcp://HOST:PORT"):
        tracker_urls("tcp://a:1,b:2")


def test_a_lost_lead_answers_nothing_a_failed_step_answers_internal() -> None:
    """A deposed leader's group was neither confirmed nor refused: it answers nothing
    (the agent resends to the next address; an INTERNAL error would fail its batch),
    and a handshake waiting then is a lost connection, not a refusal. A step that
    raised answers every request INTERNAL, as before."""
    loop = asyncio.new_event_loop()
    try:
        channel, _other = InprocChannel.pair(loop, loop, "peer")
        peer = Peer(channel)
        batch = Batch(1, 7, "k", produced(0, 1))
        for lost, expected in ((True, []), (False, [ErrorCode.INTERNAL])):
            sent: list[Any] = []
            stop = FailStop(ServerMetrics(), lambda: None, sent.extend)
            hello = Hello(WIRE_VERSION, Role.AGENT, b"n" * 16, "agent", None)
            admit = Admit(hello, None, loop.create_future())
            items: list[Any] = [Request(peer, batch), admit]
            if lost:
                stop.lost_lead(LeadLost("fenced"), items, "kafka://b/g")
            else:
                stop.failed(RuntimeError("boom"), items)
            assert [msg.code for _peer, msg in sent] == expected
            refusal = admit.reply.exception()
            assert isinstance(refusal, ConnectionLost if lost else ServiceError)
    finally:
        loop.close()
