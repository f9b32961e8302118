"""Errors raised in a Spark task, reported on the driver as the one line they are.

A task that waits for the tracker (its acks' confirmation, rule 6; a segment's min
time) waits at most the pipeline's ``hold_wait_s`` (``TrackerRef.wait_s``), then fails
with :class:`TaskAcksFailed`: its batch is not committed, so a restart from the
checkpoint runs it again under the same keys (fail closed, nothing lost).

Spark ends a query whose task failed with an exception many lines long: its own
wrapping, the Python worker's traceback, Java frames. A lowtide error is that
traceback's exception line, ``lowtide.<module>.<Class>: <message>``; the driver finds
it there (:func:`raised_in_task`) and reports that error, one line, as the query's.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Iterator

from lowtide.core.errors import LowtideError
from lowtide.spark.tracking.transport import TrackerRef, tracker_silent

__all__ = ["TaskAcksFailed", "answered_within", "raised_in_task"]

#: a traceback's exception line naming one of lowtide's classes
_LOWTIDE_LINE = re.compile(r"^(lowtide(?:\.\w+)+)\.(\w+): (.+)$", re.MULTILINE)


class TaskAcksFailed(LowtideError, TimeoutError):
    """A task's tracker did not answer within ``hold_wait_s``: the task failed, and
    with it the batch and the query, which commits nothing past that batch."""


@contextlib.contextmanager
def answered_within(ref: TrackerRef, what: str) -> Iterator[None]:
    """Turn the agent's timeout (``ref.wait_s`` passed without an answer) inside the
    block into :class:`TaskAcksFailed` naming ``what`` waited; a task's error is then
    one line that says what to do.

    >>> ref = TrackerRef("tcp://127.0.0.1:7070", None, wait_s=3)  # type: ignore[arg-type]
    >>> with answered_within(ref, "task 1 of batch 7"):
    ...     raise TimeoutError("no answer from the tracker within 3 s")
    Traceback (most recent call last):
    lowtide.spark.tracking.task_errors.TaskAcksFailed: task 1 of batch 7: the tracker at \
tcp://127.0.0.1:7070 did not answer within 3 s (hold_wait_s), so the task failed and \
its query stopped, committing nothing past that batch: check the tracker (lowtide \
status --url tcp://127.0.0.1:7070), then start the query again from its checkpoint
    """
    try:
        yield
    except TaskAcksFailed:
        raise
    except TimeoutError:
        raise TaskAcksFailed(tracker_silent(
            what, ref.url, "answer", ref.wait_s,
            "the task failed and its query stopped, committing nothing past that batch"
        )) from None


def raised_in_task(error: BaseException | None) -> LowtideError | None:
    """The lowtide error a task raised, from Spark's exception of the query (or job)
    it failed: the last lowtide exception line in its text, as an instance of the
    class it names; None if there is none.

    >>> spark_text = ("Job aborted due to stage failure: ... PythonException: Traceback "
    ...     "(most recent call last):\\n  File \\"x.py\\", line 1, in f\\n"
    ...     "lowtide.spark.tracking.task_errors.TaskAcksFailed: task 1: check it\\n"
    ...     "\\tat org.apache.spark.api.python.BasePythonRunner...")
    >>> err = raised_in_task(RuntimeError(spark_text))
    >>> type(err).__name__, str(err)
    ('TaskAcksFailed', 'task 1: check it')
    >>> raised_in_task(RuntimeError("ValueError: a user's")) is None
    True
    """
    if error is None or isinstance(error, LowtideError):
        return error
    lines = _LOWTIDE_LINE.findall(str(error))
    if not lines:
        return None
    module, name, message = lines[-1]
    try:
        cls = getattr(importlib.import_module(module), name, None)
    except ImportError:
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, LowtideError)):
        cls = LowtideError
    # the message as raised, whatever the class's own constructor takes
    err: LowtideError = cls.__new__(cls)
    err.args = (message,)
    return err
