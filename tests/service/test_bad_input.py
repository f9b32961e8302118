"""Bad input: the offending client gets a clear error, the state is unchanged, and
everyone else keeps being served. Also authentication and limits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lowtide.core.errors import (
    AckBehindHead,
    NonMonotonicHeartbeat,
    ProtocolError,
    TableOverflow,
    UnknownFront,
    UnknownSegment,
)
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import Ack, AckBatch, Heartbeat
from lowtide.service import Agent, BatchKey, ServiceError, TrackerService
from lowtide.service.auth import load_secret
from lowtide.service.deploy.standalone import main as serve_main
from lowtide.service.errors import ConnectionLost
from lowtide.service.net import Limits, StreamChannel
from lowtide.wire.frames import HEADER
from lowtide.wire.messages import (
    Batch,
    Error,
    ErrorCode,
    FrontOp,
    Ok,
    Status,
    StatusRequest,
    Welcome,
)
from tests.service.conftest import SECRET
from tests.service.raw import RawClient

pytestmark = pytest.mark.socket



def one(segment: int, time: int, value: int = 0x5, count: int = 1) -> AckBatch:
    return AckBatch.of([Ack(segment, time, value, count)])


@pytest.mark.parametrize(
    ("acks", "heartbeats", "error"),
    [
        (one(9, 20), (), UnknownSegment),
        (one(0, 3), (), AckBehindHead),
        (one(0, 20 + (1 << 21)), (), TableOverflow),
        (one(0, -1), (), ProtocolError),
        (AckBatch.empty(), (Heartbeat(1, 5),), NonMonotonicHeartbeat),
        (AckBatch.empty(), (Heartbeat(42, 50),), UnknownFront),
        (one(0, 20), (Heartbeat(42, 50),), UnknownFront),  # all or nothing: the ack neither
    ],
    ids=["segment", "behind-head", "overflow", "negative-time", "heartbeat-back", "front", "mixed"],
)
def test_protocol_errors_leave_the_state_unchanged(
    service: TrackerService, agent: Agent, graph: SegmentGraph, acks: AckBatch, heartbeats, error
) -> None:
    agent.register_front(1, "src", 10, owner="producer")
    before = agent.status()
    with pytest.raises(error):
        agent.send_batch(BatchKey("q", 0, "src", 0), acks, heartbeats)
    after = agent.status()
    for field in ("segments", "fronts", "global_min", "acks_applied", "dedup_keys"):
        assert after[field] == before[field]
    with Agent.connect(service.url, graph) as good, good.subscribe("sink") as sub:
        good.send_batch(BatchKey("task", 0, "src", 9), AckBatch.empty(), [Heartbeat(1, 30)],
                        owner="producer")
        assert sub.wait_for(30, 5).time == 30


def test_front_errors(agent: Agent) -> None:
    with pytest.raises(UnknownFront):
        agent.unregister_front(77)
    with pytest.raises(ProtocolError):
        agent.register_front(1, "sink", 0)  # not a source segment
    with pytest.raises(UnknownSegment):
        agent.register_front(1, "nope", 0)


@pytest.fixture
def raw(service: TrackerService) -> Iterator[RawClient]:
    client = RawClient.open(service.url)
    try:
        yield client
    finally:
        client.close()


def test_garbage_frame_gets_an_error_and_the_connection_goes_on(raw: RawClient) -> None:
    assert isinstance(raw.hello(), Welcome)
    raw.send_raw(HEADER.pack(3) + b"\xff\x00\x01")
    err = raw.recv()
    assert isinstance(err, Error) and err.code == ErrorCode.BAD_FRAME
    raw.send(StatusRequest(5))
    assert isinstance(raw.recv(), Status)


def test_request_before_hello_is_refused(raw: RawClient) -> None:
    raw.send(FrontOp(1, 1, True, 1, "src", 0))
    err = raw.recv()
    assert isinstance(err, Error) and err.code == ErrorCode.BAD_FRAME
    with pytest.raises(ConnectionError):
        raw.recv()


def test_wrong_graph_and_version_are_refused(raw: RawClient, service: TrackerService) -> None:
    err = raw.hello((("other", ()),))
    assert isinstance(err, Error) and err.code == ErrorCode.GRAPH_MISMATCH


def test_bad_preamble_is_dropped(service: TrackerService) -> None:
    client = RawClient.open(service.url, preamble=b"GET / HTTP/1.0\r\n\r\n")
    try:
        with pytest.raises(ConnectionError):
            client.recv()
    finally:
        client.close()


def test_oversized_frame_closes_only_that_connection(graph: SegmentGraph) -> None:
    svc = TrackerService.start(graph, limits=Limits(max_frame=4096))
    client = RawClient.open(svc.url)
    try:
        assert isinstance(client.hello(), Welcome)
        client.send_raw(HEADER.pack(1 << 20))
        err = client.recv()
        assert isinstance(err, Error) and err.code == ErrorCode.LIMIT
        with pytest.raises(ConnectionError):
            client.recv()
        with Agent.connect(svc.url, graph) as good:
            good.register_front(1, "src", 3)
            assert good.status()["global_min"] == 3
    finally:
        client.close()
        svc.stop()


def test_replayed_request_numbers_are_not_applied_twice(raw: RawClient) -> None:
    assert isinstance(raw.hello(), Welcome)
    raw.send(FrontOp(1, 99, True, 1, "src", 0))
    assert raw.recv() == Ok(1)
    batch = Batch(2, 99, "", one(0, 4))
    raw.send(batch)
    raw.send(batch)
    assert [raw.recv(), raw.recv()] == [Ok(2), Ok(2, duplicate=True)]


# ---------------------------------------------------------------- security
def test_shared_secret_admits_the_right_agents(
    secured: TrackerService, graph: SegmentGraph
) -> None:
    with Agent.connect(secured.url, graph, secret=SECRET) as agent:
        agent.register_front(1, "src", 5)
    for secret in (None, b"wrong secret, long enough"):
        with Agent.connect(secured.url, graph, secret=secret) as intruder:
            with pytest.raises(ServiceError) as info:
                intruder.register_front(2, "src", 5, timeout_s=5)
            assert info.value.code == ErrorCode.AUTH_FAILED
    assert secured.status()["fronts"] == {"1": ["src", 5]}


def test_unauthenticated_raw_peer_cannot_skip_the_challenge(secured: TrackerService) -> None:
    client = RawClient.open(secured.url)
    try:
        client.hello()  # the challenge
        client.send(FrontOp(1, 1, True, 1, "src", 0))
        err = client.recv()
        assert isinstance(err, Error) and err.code == ErrorCode.AUTH_FAILED
    finally:
        client.close()


def test_non_loopback_bind_needs_a_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOWTIDE_SECRET", raising=False)
    assert serve_main(["--host", "0.0.0.0"]) == 2
    monkeypatch.setenv("LOWTIDE_SECRET", "short")
    with pytest.raises(ValueError, match="at least"):
        load_secret()
    (tmp_path / "s").write_text(" from-a-file-0123456789 \n")
    (tmp_path / "s").chmod(0o600)
    assert load_secret(tmp_path / "s") == b"from-a-file-0123456789"


class _SlowTransport:
    def get_write_buffer_size(self) -> int:
        return 1_000  # bytes the peer has not read yet


class _Writer:
    transport = _SlowTransport()
    closed = False

    def get_extra_info(self, _name: str) -> tuple[str, int]:
        return ("10.0.0.1", 5)

    def is_closing(self) -> bool:
        return self.closed

    def write(self, _data: bytes) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_a_peer_that_does_not_read_is_dropped_at_the_buffer_limit() -> None:
    writer = _Writer()
    channel = StreamChannel(None, writer, Limits(max_buffer=1_024))  # type: ignore[arg-type]
    channel.send(Ok(1))  # still under the limit
    with pytest.raises(ConnectionLost, match="buffer limit"):
        channel.send(Status(2, "x" * 100))
    assert writer.closed
