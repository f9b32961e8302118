"""Tracked operators without Spark: the acks one task sends keep the tracker exact."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.spark.operators.tracked import (
    OpRuntime,
    apply_op,
    hold_back,
    operator_id,
    task_function,
)
from lowtide.spark.sources.generator import (
    GeneratorSpec,
    gen_partitions,
    initial_offset,
    next_offset,
)
from lowtide.spark.tracking import (
    TRACK_COL,
    AckAccumulator,
    TimeGroups,
    slots_of,
)
from lowtide.spark.tracking.transport import TrackerRef
from tests.spark.helpers import CoreAgent

GRID = TimeGrid(delta_ms=10)
GRAPH = SegmentGraph.of(("m", ()), ("f", ("m",)), ("k", ("f",)), ("sink", ("k",)))
REF = TrackerRef("memory://x", GRAPH, GRID)
T0_MS = time.time_ns() // 1_000_000  # rows labelled now: task_function unwraps with its clock
REF_SLOT = GRID.slot_of(T0_MS)


def double(b: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch({"seq": b["seq"], "x": pc.multiply(b["seq"], 2)})


def explode(b: pa.RecordBatch):
    seq = b["seq"].to_numpy()
    reps = (seq % 3).astype(np.int64)  # 0, 1 or 2 children
    parents = np.repeat(np.arange(len(seq)), reps)
    return pa.record_batch({"seq": pa.array(seq[parents]), "x": pa.array(parents)}), parents


def keep_even(b: pa.RecordBatch):
    return pc.equal(pc.bit_wise_and(b["seq"], 1), 0)


OPS = [
    OpRuntime("map", double, REF, "m", "f", operator_id("m")),
    OpRuntime("flat_map", explode, REF, "f", "k", operator_id("f")),
    OpRuntime("filter", keep_even, REF, "k", "sink", operator_id("k")),
]


SPEC = GeneratorSpec(fronts=2, rate=5_000.0, payload_bytes=0)


def _agent() -> CoreAgent:
    """A tracker whose fronts start at T0 (its tables move up to their wall-clock slots)."""
    agent = CoreAgent(GRAPH, GRID)
    off = initial_offset(SPEC, T0_MS, GRID)
    for f in SPEC.front_ids():
        agent.register_front(f, "m", off[f"f{f}"]["hb"])
    agent.step()
    return agent


def _source_batches(agent: CoreAgent):
    """The generator source's tasks (its real ``read``, tracking column included) for
    the first 200 ms of two fronts."""
    from unittest import mock

    from lowtide.spark.sources import log_source as source
    from lowtide.spark.sources.generator import GenStreamReader
    from lowtide.spark.tracking import transport

    reader = GenStreamReader({"spec": SPEC.to_json(), "lowtide.tracker": REF.to_option(),
                              "lowtide.segment": "m"})
    off = initial_offset(SPEC, T0_MS, GRID)
    parts = gen_partitions(off, next_offset(SPEC, off, T0_MS + 200, GRID))
    with mock.patch.dict(transport._factories, {"memory": lambda ref: agent}), \
            mock.patch.object(source, "task_identity",
                              lambda: transport.TaskIdentity("q", 0, 0, 0)):
        out = [b.select(["seq", TRACK_COL]) for part in parts for b in reader.read(part)]
    return out, min(p.extra[1] for p in parts)


def _run(agent: CoreAgent, op: OpRuntime, batches, key):
    acc = AckAccumulator()
    outs = [apply_op(op, b, acc, GRAPH.index(op.in_segment), GRAPH.index(op.out_segment),
                     REF_SLOT) for b in batches]
    agent.send_batch(key, acc.build(GRID.window_slots))
    return outs


def _sink(agent: CoreAgent, batches, key):
    acc = AckAccumulator()
    for b in batches:
        acc.add_packed(GRAPH.index("sink"), b[TRACK_COL].to_numpy(), REF_SLOT, -1)
    agent.send_batch(key, acc.build(1))


def test_chain_completes_exactly_once_the_sink_acks() -> None:
    agent = _agent()
    batches, hb = _source_batches(agent)
    for i, op in enumerate(OPS):
        batches = _run(agent, op, batches, ("q", 0, op.in_segment, i))
        mins = agent.step()
        assert mins["sink"] < hb  # nothing is complete before the sink's receipt
    _sink(agent, batches, ("q", 0, "sink", 0))
    assert agent.step()["sink"] == hb


def test_retry_is_idempotent_and_identical() -> None:
    agent = _agent()
    batches, _hb = _source_batches(agent)
    first = _run(agent, OPS[0], batches, ("q", 0, "m", 0))
    again = _run(agent, OPS[0], batches, ("q", 0, "m", 0))  # a re-run task
    assert all(a.equals(b) for a, b in zip(first, again, strict=True))
    assert len(agent.batches) == 3  # two source tasks + one op task: the re-run was dropped


def test_untracked_drop_is_reported_as_missing() -> None:
    agent = _agent()
    batches, hb = _source_batches(agent)
    batches = _run(agent, OPS[0], batches, ("q", 0, "m", 0))
    dropped = [b.slice(1) for b in batches]  # an untracked filter
    for op in OPS[1:]:
        dropped = _run(agent, op, dropped, ("q", 0, op.in_segment, 0))
    _sink(agent, dropped, ("q", 0, "sink", 0))
    agent.step()
    _windows, _x, counts = agent.tracker.open_windows("f")
    assert int(counts.sum()) == len(batches) and agent.tracker.min_time("sink") < hb


def test_map_must_keep_row_count() -> None:
    agent = _agent()
    batches, _ = _source_batches(agent)
    bad = OpRuntime("map", lambda b: b.slice(0, 1), REF, "m", "f", 1)
    with pytest.raises(ValueError, match="flat_map"):
        _run(agent, bad, batches, ("q", 0, "m", 0))


def test_flat_map_with_parent_column_equals_tuple_form() -> None:
    def with_column(b: pa.RecordBatch) -> pa.RecordBatch:
        out, parents = explode(b)
        return out.append_column("_parent", pa.array(parents))

    agent = _agent()
    batches, _ = _source_batches(agent)
    a = _run(agent, OPS[1], batches, ("q", 0, "f", 0))
    col = OpRuntime("flat_map", with_column, REF, "f", "k", operator_id("f"))
    b = _run(_agent(), col, batches, ("q", 0, "f", 0))
    assert all(x.equals(y) for x, y in zip(a, b, strict=True))
    assert "_parent" not in b[0].schema.names


def test_untracked_duplicate_is_reported_as_extra() -> None:
    agent = _agent()
    batches, hb = _source_batches(agent)
    batches = _run(agent, OPS[0], batches, ("q", 0, "m", 0))
    doubled = [pa.concat_batches([b, b.slice(0, 2)]) for b in batches]  # untracked dup
    for op in OPS[1:]:
        doubled = _run(agent, op, doubled, ("q", 0, op.in_segment, 0))
    _sink(agent, doubled, ("q", 0, "sink", 0))
    agent.step()
    _w, _x, counts = agent.tracker.open_windows("f")
    assert int(counts.sum()) == -2 * len(batches)  # received more often than sent
    assert agent.tracker.min_time("sink") < hb


def test_map_acks_do_not_depend_on_row_order() -> None:
    """After a repartition rows arrive in any order: the per-time XORs stay the same."""
    agent = _agent()
    batches, _hb = _source_batches(agent)
    whole = pa.concat_batches(batches)
    shuffled = whole.take(pa.array(np.random.default_rng(7).permutation(whole.num_rows)))
    in_order, any_order = AckAccumulator(), AckAccumulator()
    m = GRAPH.index("m"), GRAPH.index("f")
    apply_op(OPS[0], whole, in_order, *m, REF_SLOT)
    apply_op(OPS[0], shuffled, any_order, *m, REF_SLOT)
    a, b = in_order.build(GRID.window_slots), any_order.build(GRID.window_slots)
    assert len(np.unique(slots_of(whole[TRACK_COL].to_numpy(), REF_SLOT))) > 1
    for col in ("segment", "time", "xor", "count"):
        assert (getattr(a, col) == getattr(b, col)).all()
    assert in_order.rows_received == any_order.rows_received == whole.num_rows


@pytest.mark.parametrize("layout", ["narrow", "narrow sorted", "medium", "wide runs",
                                    "wide shuffled"])
def test_time_groups_match_a_reference(layout: str) -> None:
    rng = np.random.default_rng(3)
    if layout == "narrow":  # a micro-batch after a shuffle: few slots, any order
        times = rng.integers(10**11, 10**11 + 7, 5_000)
    elif layout == "narrow sorted":  # a source's rows
        times = np.sort(rng.integers(10**11, 10**11 + 7, 5_000))
    elif layout == "medium":  # a lagging front's backlog: 16-bit offsets, any order
        times = rng.integers(10**11, 10**11 + 30_000, 5_000)
    elif layout == "wide runs":  # grouped by time, runs out of order, spanning > 2**16
        times = np.repeat(rng.integers(0, 2**40, 40), 50)
    else:
        times = rng.integers(0, 2**40, 5_000) // 1_000 * 1_000
    times = times.astype(np.int64)
    acks = rng.integers(0, 2**63, len(times)).astype(np.uint64) * np.uint64(2)
    ref: dict[int, tuple[int, int]] = {}
    for t, a in zip(times.tolist(), acks.tolist(), strict=True):
        x, c = ref.get(t, (0, 0))
        ref[t] = (x ^ a, c + 1)
    groups = TimeGroups.of(times)
    got = zip(groups.times.tolist(), groups.xor(acks).tolist(), groups.counts.tolist(),
              strict=True)
    assert {t: (x, c) for t, x, c in got} == ref
    assert groups.times.tolist() == sorted(ref)


@pytest.fixture
def memory_agent(monkeypatch: pytest.MonkeyPatch):
    """task_function outside Spark: the ``memory://`` tracker is a CoreAgent, the task
    belongs to batch 0."""
    from lowtide.spark.sources import log_source as source
    from lowtide.spark.tracking import transport

    agent = _agent()
    transport.register_scheme("memory", lambda ref: agent)
    monkeypatch.setattr(source, "task_identity", lambda: transport.TaskIdentity("q", 0, 0, 0))
    monkeypatch.setattr("lowtide.spark.operators.tracked.task_identity",
                        lambda: transport.TaskIdentity("q", 0, 0, 0))
    yield agent
    transport.register_scheme("memory", None)


def test_the_last_operators_tasks_ack_the_null_sink_after_their_own_batch(
    memory_agent: CoreAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the null sink (Spark's ``noop``, same task) each task of the last operator
    sends its usual batch, then the sink's receipts of exactly what it sent into the
    sink, keyed apart; the sink completes only when every partition's task has."""
    import pyspark

    partition = [0]
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(
        lambda: type("TC", (), {"partitionId": lambda self: partition[0]})()))
    batches, hb = _source_batches(memory_agent)
    for op in OPS[:-1]:
        batches = list(task_function(op)(iter(batches)))
    last = replace(OPS[-1], null_sink=True)
    sink = GRAPH.index("sink")
    for p, part in enumerate(([batches[0]], batches[1:])):
        assert memory_agent.step()["sink"] < hb  # partition p's rows are not in yet
        partition[0] = p
        before = len(memory_agent.batches)
        assert len(list(task_function(last)(iter(part)))) == len(part)
        (k_op, op_acks, _), (k_sink, receipts, _) = memory_agent.batches[before:]
        assert (k_op.segment, k_op.partition) == ("k", p)
        assert (k_sink.segment, k_sink.partition) == ("<null>sink", p)
        sent = op_acks.segment == sink
        assert sent.any() and (receipts.segment == sink).all()
        assert receipts.xor.tolist() == op_acks.xor[sent].tolist()
        assert receipts.count.tolist() == (-op_acks.count[sent]).tolist()
    assert memory_agent.step()["sink"] == hb


def test_hold_back_keeps_the_latest_outputs_up_to_its_cap_until_its_callback() -> None:
    """Nothing is lost or reordered; at most ``cap_bytes`` (at least one output) is
    held when the callback runs."""

    @dataclass(frozen=True)
    class Out:
        name: str
        nbytes: int

    def run(sizes: list[int], cap: int) -> list[str]:
        events: list[str] = []
        outs = (Out(str(i), n) for i, n in enumerate(sizes))
        for out in hold_back(outs, cap, lambda: events.append("submit")):
            events.append(out.name)
        return events

    assert run([5, 5, 5], 100) == ["submit", "0", "1", "2"]
    assert run([5, 5, 5], 10) == ["0", "submit", "1", "2"]
    assert run([5, 5, 5], 0) == ["0", "1", "submit", "2"]
    assert run([50, 5], 10) == ["0", "submit", "1"]
    assert run([], 10) == ["submit"]


def test_a_task_submits_its_acks_before_its_held_outputs_and_waits_at_its_end(
    memory_agent: CoreAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the last input batch is processed every ack is known: the batch travels
    while the outputs held back go out, and the task waits for the confirmation only
    at its end (rule 6), instead of a round trip after its output. Past the byte cap
    the earliest outputs go out before the batch."""

    events: list[str] = []
    submit = memory_agent.submit_batch

    class Recorded:
        def __init__(self, pending) -> None:
            self.pending = pending

        def wait(self) -> bool:
            events.append("wait")
            return bool(self.pending.wait())

    def recording(key, acks, heartbeats=(), timeout_s=30.0, *, owner=None):
        events.append(f"submit {key.segment}")
        return Recorded(submit(key, acks, heartbeats, timeout_s, owner=owner))

    batches, _hb = _source_batches(memory_agent)
    assert len(batches) >= 2
    monkeypatch.setattr(memory_agent, "submit_batch", recording)
    for _out in task_function(OPS[0])(iter(batches)):
        events.append("out")
    assert events == ["submit m"] + ["out"] * len(batches) + ["wait"]
    events.clear()
    for _out in task_function(replace(OPS[0], hold_output_bytes=1))(iter(batches)):
        events.append("out")
    assert events == ["out"] * (len(batches) - 1) + ["submit m", "out", "wait"]
    assert list(task_function(OPS[0])(iter([]))) == [] and events[-1] == "wait"  # nothing new
    # confirm=False (benchmarks only: what the wait costs): submitted, never waited for
    events.clear()
    unconfirmed = replace(OPS[0], ref=TrackerRef.from_option(replace(REF, confirm=False)
                                                              .to_option()))
    assert unconfirmed.ref.confirm is False
    for _out in task_function(unconfirmed)(iter(batches)):
        events.append("out")
    assert events == ["submit m"] + ["out"] * len(batches)


def test_chained_steps_share_one_task_and_one_batch(memory_agent: CoreAgent) -> None:
    """map -> flat_map -> filter chained in one task (no shuffle between them): one
    keyed batch, by the first step's input segment; the middle segments' sends and
    receipts cancel inside it, and the rows are those of the three tasks in a row."""
    batches, hb = _source_batches(memory_agent)
    expected = batches
    for op in OPS:
        expected = [apply_op(op, b, AckAccumulator(), GRAPH.index(op.in_segment),
                             GRAPH.index(op.out_segment), REF_SLOT) for b in expected]
    before = len(memory_agent.batches)
    out = list(task_function(*OPS)(iter(batches)))
    assert [b.to_pydict() for b in out] == [b.to_pydict() for b in expected]
    (key, acks, _), = memory_agent.batches[before:]
    assert key.segment == "m"
    middle = np.isin(acks.segment, [GRAPH.index("f"), GRAPH.index("k")])
    assert (acks.count[middle] == 0).all() and (acks.xor[middle] == 0).all()
    assert memory_agent.step()["k"] == hb  # nothing in flight before the sink
