"""A retry loop without Spark: a step's task (its real mapInArrow function) and the loop
source's receipts, against the core tracker. Failed rows go round with their time and a
fresh ack per attempt; the loop holds the sink until they succeed or are given up; a
re-run task writes the same files and sends the same acks; a loop file whose acks
never arrived leaves its parents in flight."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.spark.operators import retry as retry_mod
from lowtide.spark.operators.retry import RetryPolicy, RetrySpec, retry_task
from lowtide.spark.sources import log_source
from lowtide.spark.sources.loop_source import receive_loop_rows
from lowtide.spark.sources.retry_log import DEAD_DIR, loop_files, read_loop_file
from lowtide.spark.tracking import transport
from lowtide.spark.tracking.column import TRACK_COL, AckAccumulator, ack_ids, pack, slots_of
from lowtide.spark.tracking.transport import TaskIdentity, TrackerRef
from tests.spark.helpers import CoreAgent

GRID = TimeGrid(delta_ms=10)
GRAPH = SegmentGraph.of(("in", ()), ("score", ("in", "score.retry")),
                        ("score.retry", ("score",)), ("sink", ("score",)))
REF = TrackerRef("memory://retry", GRAPH, GRID)
T = GRID.slot_of(time.time_ns() // 1_000_000)  # rows labelled now: tasks unwrap with their clock


def fails_twice(b: pa.RecordBatch) -> pa.RecordBatch:
    """Rows with seq % 3 == 0 fail their first two attempts; seq % 5 == 0 always."""
    seq = b["seq"]
    s, a = seq.to_numpy(), b["lt_attempt"].to_numpy()
    failed = ((s % 3 == 0) & (a < 2)) | (s % 5 == 0)
    error = pa.array(np.where(failed, "down", None).tolist(), pa.string())
    return pa.record_batch({"seq": seq, "double": pc.multiply(seq, 2), "error": error})


def rows(n: int = 30) -> pa.RecordBatch:
    seq = np.arange(n, dtype=np.int64)
    times = T + seq % 4  # four slots
    packed = pack(times, (seq + 1).astype(np.uint64) * np.uint64(7919), T)
    return pa.record_batch({"seq": seq, "lt_attempt": pa.array(np.zeros(n, np.int32)),
                            TRACK_COL: packed})


@contextmanager
def tracked(agent: CoreAgent, batch_id: int, partition: int = 0):
    ident = TaskIdentity("q", batch_id, partition, 0)
    with mock.patch.dict(transport._factories, {"memory": lambda ref: agent}), \
            mock.patch.object(retry_mod, "task_identity", lambda: ident), \
            mock.patch.object(log_source, "task_identity", lambda: ident):
        yield


def agent_with_rows(batch: pa.RecordBatch) -> CoreAgent:
    """A tracker whose front 0 has sent ``batch``'s rows into ``score`` and
    heartbeated past them."""
    agent = CoreAgent(GRAPH, GRID)
    agent.register_front(0, "in", T)
    agent.step()  # the tables move up to the front
    acc = AckAccumulator()
    acc.add_packed(GRAPH.index("score"), batch[TRACK_COL].to_numpy(), T, +1)
    agent.send_batch(("src", 0), acc.build(1))
    agent.heartbeat(0, T + 10)
    return agent


def step(agent: CoreAgent, spec: RetrySpec, batches: list[pa.RecordBatch],
         batch_id: int) -> list[pa.RecordBatch]:
    with tracked(agent, batch_id):
        return list(retry_task(spec.runtime(REF, "sink"))(iter(batches)))


def sink(agent: CoreAgent, outs: list[pa.RecordBatch], batch_id: int) -> None:
    acc = AckAccumulator()
    for b in outs:
        acc.add_packed(GRAPH.index("sink"), b[TRACK_COL].to_numpy(), T, -1)
    agent.send_batch(("sink", batch_id), acc.build(1))


def read_back(agent: CoreAgent, path: str, batch_id: int) -> list[pa.RecordBatch]:
    """The loop source's next micro-batch: every loop file, received and sent on."""
    out = []
    with tracked(agent, batch_id):
        for i, name in enumerate(loop_files(path)):
            table = read_loop_file(path, name)
            receive_loop_rows(REF, "score.retry", "score", table, i).wait()
            out.extend(table.to_batches())
            Path(path, "loop", name).unlink()
    return out


def spec_of(tmp_path: Path, attempts: int = 3) -> RetrySpec:
    return RetrySpec("score", fails_twice, "seq long, double long",
                     RetryPolicy(attempts, str(tmp_path)).build("score"))


def test_failed_rows_go_round_with_their_time_until_done_or_given_up(tmp_path: Path) -> None:
    batch = rows()
    agent = agent_with_rows(batch)
    spec = spec_of(tmp_path)
    pending, batch_id, done = [batch], 0, []
    ids_seen: set[int] = set(ack_ids(batch[TRACK_COL].to_numpy()).tolist())
    while pending:
        outs = step(agent, spec, pending, batch_id)
        sink(agent, outs, batch_id)
        done.extend(outs)
        mins = agent.step()
        if loop_files(str(tmp_path)):
            # LOOP HOLDS: a row waiting for its retry holds the sink at its time
            waiting = pa.concat_tables(read_loop_file(str(tmp_path), n)
                                       for n in loop_files(str(tmp_path)))
            assert mins["sink"] <= int(slots_of(waiting[TRACK_COL].to_numpy(), T).min())
            assert mins["score"] == mins["score.retry"]  # one component, one min time
        batch_id += 1
        pending = read_back(agent, str(tmp_path), batch_id)
        for b in pending:
            # KEEPS TIME, FRESH ACK: same slots as the first attempt, new ids
            ids = ack_ids(b[TRACK_COL].to_numpy()).tolist()
            assert not ids_seen & set(ids)
            ids_seen |= set(ids)
            first = {s: T + s % 4 for s in b["seq"].to_pylist()}
            assert slots_of(b[TRACK_COL].to_numpy(), T).tolist() == list(first.values())
        batch_id += 1
    out = pa.Table.from_batches(done)
    seq = np.arange(30)
    assert sorted(out["seq"].to_pylist()) == seq[seq % 5 != 0].tolist()
    dead = pq.read_table(tmp_path / DEAD_DIR)
    assert sorted(dead["seq"].to_pylist()) == seq[seq % 5 == 0].tolist()
    assert set(dead["lt_attempt"].to_pylist()) == {3} and set(dead["error"].to_pylist()) == {"down"}
    assert sorted(dead["lt_time"].to_pylist()) == sorted((T + seq[seq % 5 == 0] % 4).tolist())
    # LIVENESS: every row done or given up, the loop is empty and the sink passes them
    assert agent.step()["sink"] == T + 10


def test_a_rerun_task_writes_the_same_files_and_acks_once(tmp_path: Path) -> None:
    batch = rows()
    agent = agent_with_rows(batch)
    spec = spec_of(tmp_path, attempts=1)  # seq % 3 and % 5 are given up at once
    first = step(agent, spec, [batch], 0)
    files = {p.name: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    again = step(agent, spec, [batch], 0)  # Spark's retry of the task
    assert all(a.equals(b) for a, b in zip(first, again, strict=True))
    assert {p.name: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files
    assert len(agent.batches) == 2  # the source's and the step's: the re-run was dropped
    sink(agent, first, 0)
    assert agent.step()["sink"] == T + 10
    assert pq.read_table(tmp_path / DEAD_DIR).num_rows == 14


def test_a_loop_file_whose_acks_never_arrived_holds_the_loop(tmp_path: Path) -> None:
    """The task wrote its loop file and died before its batch was applied: its input
    rows are still in flight in the step's segment, so nothing at or above their time
    is announced; the re-run writes the same file and its acks complete the loop."""
    batch = rows()
    agent = agent_with_rows(batch)
    spec = spec_of(tmp_path)
    with mock.patch.object(retry_mod, "submit_task_batch",
                           side_effect=RuntimeError("executor lost")), \
            pytest.raises(RuntimeError):
        step(agent, spec, [batch], 0)
    written = {n: read_loop_file(str(tmp_path), n) for n in loop_files(str(tmp_path))}
    assert written  # on storage, its acks nowhere
    mins = agent.step()
    assert mins["score"] == mins["sink"] == T  # FAIL CLOSED: held at the first row's time
    outs = step(agent, spec, [batch], 0)  # the batch run again
    assert {n: read_loop_file(str(tmp_path), n) for n in loop_files(str(tmp_path))} == written
    sink(agent, outs, 0)
    assert agent.step()["sink"] == T  # the retried rows are in the loop now
    back = read_back(agent, str(tmp_path), 1)
    assert sum(b.num_rows for b in back) == sum(t.num_rows for t in written.values())


def test_a_retried_map_must_keep_its_rows(tmp_path: Path) -> None:
    spec = RetrySpec("score", lambda b: b.slice(1), "seq long",
                     RetryPolicy(2, str(tmp_path)).build("score"))
    batch = rows()
    with pytest.raises(ValueError, match="one row per input row"):
        step(agent_with_rows(batch), spec, [batch], 0)


@pytest.mark.parametrize(("policy", "match"), [
    (RetryPolicy(0, "/x"), "attempts=0"), (RetryPolicy(2), "needs path="),
])
def test_bad_policies_are_one_line_errors(policy: RetryPolicy, match: str) -> None:
    with pytest.raises(ValueError, match=match) as err:
        policy.build("score")
    assert "\n" not in str(err.value)
