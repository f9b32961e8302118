"""A task's acks on a tracker that does not answer (no Spark, no sockets): the task
waits the pipeline's ``hold_wait_s`` (carried by its ``TrackerRef``), not the agent's
own 30 s, then fails with one line; the driver finds that line in Spark's many-line
report of the failed task. End to end, with a SIGSTOPped ``lowtide serve``:
tests/spark/operators/test_hold_wait_e2e.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from lowtide.core.errors import LowtideError
from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.spark.sinks.foreach import SinkAcksFailed
from lowtide.spark.sources import log_source
from lowtide.spark.tracking.column import AckAccumulator
from lowtide.spark.tracking.task_errors import TaskAcksFailed, raised_in_task
from lowtide.spark.tracking.transport import TaskIdentity, TrackerRef, register_scheme

GRAPH = SegmentGraph.of(("m", ()), ("sink", ("m",)))
REF = TrackerRef("hungtask://tracker:7070", GRAPH, TimeGrid(delta_ms=10), wait_s=2.5)


class HungPending:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    def wait(self) -> bool:
        raise TimeoutError(f"no answer from the tracker within {self.timeout_s} s")


class HungAgent:
    """An agent whose tracker never confirms: each batch times out after its wait."""

    def __init__(self) -> None:
        self.waits_s: list[float] = []

    def submit_batch(self, key: Any, acks: Any, heartbeats: Any = (), timeout_s: float = 30.0,
                     **_: Any) -> HungPending:
        self.waits_s.append(timeout_s)
        return HungPending(timeout_s)


@pytest.fixture
def hung(monkeypatch: pytest.MonkeyPatch) -> Any:
    agent = HungAgent()
    register_scheme("hungtask", lambda ref: agent)
    monkeypatch.setattr(log_source, "task_identity", lambda: TaskIdentity("q-1", 7, 1, 0))
    yield agent
    register_scheme("hungtask", None)


def test_the_ref_carries_hold_wait_to_the_tasks() -> None:
    assert TrackerRef.from_option(REF.to_option()).wait_s == 2.5
    assert TrackerRef("tcp://x:1", GRAPH).wait_s == 30.0  # the default: HOLD_WAIT_S


def test_a_task_waits_hold_wait_then_fails_with_one_line(hung: Any) -> None:
    acc = AckAccumulator()
    acc.add_reduced(GRAPH.index("m"), np.array([100], np.int64),
                    np.array([7], np.uint64), np.array([-1], np.int64))
    sent = log_source.submit_task_batch(REF, "m", 1, acc)
    with pytest.raises(TaskAcksFailed) as raised:
        sent.wait()
    assert hung.waits_s == [2.5]  # the pipeline's hold_wait_s, not the agent's 30 s
    text = str(raised.value)
    assert "\n" not in text and text.startswith(
        "the acks of segment 'm' from task 1 of batch 7 of query q-1: ")
    assert "within 2.5 s (hold_wait_s)" in text
    assert "lowtide status --url hungtask://tracker:7070" in text
    assert isinstance(raised.value, TimeoutError)  # what callers caught before


def test_an_empty_task_never_waits(hung: Any) -> None:
    log_source.submit_task_batch(REF, "m", 1, AckAccumulator()).wait()
    assert hung.waits_s == []


SPARK_REPORT = """\
[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Job aborted due \
to stage failure: Task 1 in stage 9.0 failed 4 times, most recent failure: Lost task \
1.3 in stage 9.0 (TID 40) (host executor driver): org.apache.spark.api.python.\
PythonException: Traceback (most recent call last):
  File "/x/lowtide/spark/sources/log_source.py", line 120, in wait
    self.pending.wait()
TimeoutError: no answer from the tracker within 2.5 s

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/x/lowtide/spark/operators/tracked.py", line 214, in run
lowtide.spark.tracking.task_errors.TaskAcksFailed: the acks of segment 'm': check it

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException
"""


def test_the_driver_reports_the_tasks_line_as_the_error_it_names() -> None:
    err = raised_in_task(RuntimeError(SPARK_REPORT))
    assert type(err) is TaskAcksFailed and str(err) == "the acks of segment 'm': check it"
    sink = raised_in_task(RuntimeError("...\nlowtide.spark.sinks.foreach.SinkAcksFailed: x\n"))
    assert type(sink) is SinkAcksFailed and str(sink) == "x"


def test_a_users_error_or_an_unknown_name_is_not_taken_for_lowtides() -> None:
    assert raised_in_task(RuntimeError("Traceback ...\nValueError: bad row\n")) is None
    assert raised_in_task(None) is None
    unknown = raised_in_task(RuntimeError("lowtide.nowhere.Gone: what to do\n"))
    assert type(unknown) is LowtideError and str(unknown) == "what to do"
    own = TaskAcksFailed("one line")
    assert raised_in_task(own) is own
