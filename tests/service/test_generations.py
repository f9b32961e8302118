"""A graph that changes while the tracker runs (rule 16), over real sockets: a second
query attaches to a running ``lowtide serve``, the first keeps going on its own
generation's graph, a ``kill -9`` and restart recover both generations, and a graph or
a record of generations that does not follow from the last is refused.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from lowtide.core.errors import ProtocolError
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import Ack, AckBatch
from lowtide.service import Agent, BatchKey, TrackerService
from lowtide.service.persistence.state_dir import StateDirRefused
from lowtide.wire.messages import ChangeGraph
from tests.service.procs import graph, serve, wait_until, write_graph

SECOND = (("src2", ()), ("sink2", ("src2",)))
X, Y, Y1 = 0xA0, 0xB0, 0xB1


def min_times(agent: Agent) -> dict[str | None, int]:
    doc = agent.status()
    return {None: doc["global_min"],
            **{s["segment"]: s["min_time"] for s in doc["segments"]}}


def second_query_runs(b: Agent) -> None:
    """Query 2 on the new segments: front 2 sends Y at 12, src2 passes its child Y1
    on to sink2 (child first, rule 2), sink2 receives it, front 2 moves to 30."""
    b.register_front(2, "src2", 12)
    b.send_batch(BatchKey("q2", 0, "src2", 2), AckBatch.of([Ack(2, 12, Y, +1)]))
    b.send_batch(BatchKey("q2", 0, "sink2", 0),
                 AckBatch.of([Ack(3, 12, Y1, +1), Ack(2, 12, Y, -1)]))
    b.send_batch(BatchKey("q2", 1, "sink2", 1), AckBatch.of([Ack(3, 12, Y1, -1)]))
    b.heartbeat(2, 30)
    b.flush()


@pytest.mark.parametrize("snapshot_every_s", [30.0, 0.05], ids=["log-only", "snapshots"])
def test_a_second_query_attaches_and_both_generations_survive_kill9(
        tmp_path: Path, snapshot_every_s: float) -> None:
    state = tmp_path / "state"
    args = ("--graph", str(write_graph(tmp_path)), "--state-dir", str(state),
            "--snapshot-every-s", str(snapshot_every_s))
    g0 = graph()
    with serve(tmp_path, *args) as first:
        a, b = Agent.connect(first.url, g0), Agent.connect(first.url, g0)
        try:
            a.register_front(1, "src", 10)
            a.send_batch(BatchKey("q1", 0, "src", 1), AckBatch.of([Ack(0, 10, X, +1)]))
            a.heartbeat(1, 20)
            a.flush()
            wait_until(lambda: min_times(a)["sink"] == 10)
            g1 = b.change_graph(attach=SECOND)          # starts at the global min, 10
            assert g1.names == ("src", "sink", "src2", "sink2")
            assert min_times(b)["src2"] == 10 and min_times(b)[None] == 10
            second_query_runs(b)
            wait_until(lambda: min_times(b)["sink2"] == 30)
            assert min_times(a)[None] == 10               # X holds it: nothing premature
            a.heartbeat(1, 25)                             # query 1 goes on, untouched
            a.flush()
            wait_until(lambda: min_times(a)["src"] == 10 and min_times(a)["sink"] == 10)
            time.sleep(0.3)  # with snapshots: several taken since the change
            first.kill9()
            with serve(tmp_path, *args, "--port", str(first.port)) as second:
                # both reconnect: a with generation 0's graph, b with generation 1's
                after = wait_until(lambda: min_times(a))
                assert after == {None: 10, "src": 10, "sink": 10, "src2": 30, "sink2": 30}
                doc = b.status()
                assert doc["generation"] == 1 and len(doc["graph"]) == 4
                a.send_batch(BatchKey("q1", 1, "sink", 0),
                             AckBatch.of([Ack(1, 10, X + 1, +1), Ack(0, 10, X, -1)]))
                a.send_batch(BatchKey("q1", 2, "out", 0), AckBatch.of([Ack(1, 10, X + 1, -1)]))
                a.heartbeat(1, 40)
                b.heartbeat(2, 50)
                a.flush()
                b.flush()
                wait_until(lambda: min_times(a) == {None: 40, "src": 40, "sink": 40,
                                                    "src2": 50, "sink2": 50})
                assert '"event": "recovered"' in second.log()
        finally:
            a.close()
            b.close()
    lines = [json.loads(line) for line in (state / "generations.jsonl").read_text().splitlines()]
    assert [(e["generation"], e["fingerprint"], e["attached"]) for e in lines] == [
        (1, g1.fingerprint(), ["src2", "sink2"])]


def start_with_two_generations(state: Path) -> SegmentGraph:
    """A state dir whose tracker attached query 2 and detached query 1; returns the
    graph it reached."""
    svc = TrackerService.start(graph(), state_dir=state)
    try:
        with Agent.connect(svc.url, graph()) as agent:
            agent.register_front(1, "src", 10)
            agent.change_graph(attach=SECOND)
            made = agent.change_graph(detach=("sink", "src"))
    finally:
        svc.stop()
    return made


def test_recovery_serves_the_last_generation_to_any_earlier_graph(tmp_path: Path) -> None:
    state = tmp_path / "state"
    made = start_with_two_generations(state)
    assert made.detached == (0, 1)
    for serve_graph in (graph(), made):  # generation 0's, or the last one's
        svc = TrackerService.start(serve_graph, state_dir=state)
        try:
            with Agent.connect(svc.url, serve_graph) as agent:
                doc = agent.status()
                assert doc["generation"] == 2
                assert [s["detached"] for s in doc["segments"]] == [True, True, False, False]
                with pytest.raises(ProtocolError, match="detached"):
                    agent.register_front(3, "src", 20)
        finally:
            svc.stop()


def test_a_graph_that_does_not_follow_from_the_last_generation_is_refused(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    start_with_two_generations(state)
    # a later generation of generation 0, but not of generation 2: refused, not served
    other = SegmentGraph.ordered([*(graph().spec(s) for s in range(2)),
                                  *(SegmentGraph.of(("x", ())).spec(0),)])
    with pytest.raises(StateDirRefused, match="does not follow from generation 2"):
        TrackerService.start(other, state_dir=state)


def test_a_record_of_generations_out_of_order_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    start_with_two_generations(state)
    path = state / "generations.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(reversed(lines)) + "\n")      # 2 before 1
    with pytest.raises(StateDirRefused, match="not 1, 2, 3"):
        TrackerService.start(graph(), state_dir=state)
    path.write_text(lines[0] + "\n" + lines[0].replace('"generation": 1', '"generation": 2')
                    .replace(json.loads(lines[0])["fingerprint"], "0" * 16) + "\n")
    with pytest.raises(StateDirRefused, match="generation 2 is 0000"):
        TrackerService.start(graph(), state_dir=state)


def test_an_out_of_order_change_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    svc = TrackerService.start(graph())
    try:
        with Agent.connect(svc.url, graph()) as first, \
                Agent.connect(svc.url, graph()) as racing:
            first.change_graph(attach=SECOND)
            # racing computed generation 1 too: the tracker is at 1 already
            with pytest.raises(ProtocolError, match="does not follow generation 1"):
                racing._call(racing._state.main_request(ChangeGraph(0, 0, 1, (("x", ()),))), 10)
            assert first.status()["generation"] == 1
    finally:
        svc.stop()

