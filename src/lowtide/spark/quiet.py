"""Muting PySpark's Python-worker noise (``SessionConfig(quiet=True)``).

Log4j settings quiet the JVM, but not what Spark's Python processes print: the JVM
copies their output to its own stderr line by line, and Spark has no setting for it.
``transformWithStateInPandas``'s driver-side runner prints five lines with object
reprs each time a stateful query starts, and a driver-side data source runner whose
JVM end closes while a query stops can print a ``BrokenPipeError`` traceback. The JVM
also starts with three lines of its own (an incubator module warning, and Spark saying
it set the log level to WARN, which lowtide's log configuration overrides). A
lowtide command's user should see none of them.

The driver's own Python prints two more: PySpark's accumulator server reads updates
from a JVM socket until it ends, and a socket the JVM closes (a stopping query's) ends
in an ``EOFError`` traceback from ``socketserver``. :func:`mute_accumulator_hangups`
makes that end quiet; nothing was lost, every update before it was applied. And py4j
logs each error a ``foreachBatch`` function raises, with its traceback: for lowtide's
own errors (a sink's acks the tracker did not confirm, or a task's, which fails the
job the function ran), which the query reports as one line, and for a job the query's
stop cancelled or a call into the JVM it interrupted (a window's hold that failed
closed stops its query mid-batch),
:func:`mute_reported_errors` drops that log record; a user function's error is logged
as before.

:func:`filtered_jvm_stderr` launches the JVM with its stderr on a pipe; a thread
copies each line to the real stderr, in order, except what :class:`NoiseFilter`
drops. Everything else (Spark's own error lines, a real traceback) passes unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socketserver
import threading
from collections.abc import Iterator

from lowtide.spark.tracking.task_errors import raised_in_task

__all__ = ["NoiseFilter", "filtered_jvm_stderr", "mute_accumulator_hangups",
           "mute_reported_errors"]

_WORKER_NOISE = "TransformWithStateInPandas Python worker"
_START_NOISE = ("WARNING: Using incubator modules:", "Setting default log level to",
                "To adjust logging level use sc.setLogLevel")
#: a PySpark process's end of a socket the JVM already closed: a query stopping, or a
#: worker that started after the JVM stopped waiting for it (the query's error says so)
_STOP_ERRORS = ("BrokenPipeError", "ConnectionResetError", "ConnectionRefusedError")
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct")
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(: |$)")
#: a traceback longer than this is passed on as it is (never held without bound)
MAX_HELD_LINES = 400


class NoiseFilter:
    """Line filter: ``feed(line)`` returns the lines to pass on now; ``close()`` the
    rest. A traceback (with its chained ones) is held until it ends, then dropped only
    if one of its exceptions is a broken connection and its frames are PySpark's (a
    runner whose query stopped); lines of other processes written into its middle are
    filtered as usual.

    >>> f = NoiseFilter()
    >>> f.feed("Starting Streaming TransformWithStateInPandas Python worker.\\n")
    []
    >>> f.feed("\\n")  # the runner's print adds an empty line to each message
    []
    >>> f.feed("Traceback (most recent call last):\\n")
    []
    >>> f.feed('  File "/x/pyspark/sql/worker/plan_data_source_read.py", line 9\\n')
    []
    >>> f.feed("BrokenPipeError: [Errno 32] Broken pipe\\n")
    []
    >>> f.feed("ERROR something real\\n")
    ['ERROR something real\\n']
    """

    def __init__(self) -> None:
        self._held: list[str] = []
        self._ended = False  # the held traceback printed an exception line
        self._marker = False  # ... and then "During handling of the above exception"
        self._after_noise = False

    def feed(self, line: str) -> list[str]:
        if not self._held:
            if line.startswith(_TRACEBACK):
                self._held, self._ended, self._marker = [line], False, False
                return []
            return self._plain(line)
        if self._ended:  # after an exception line: a chained traceback, or the end
            if not line.strip() or line.startswith(_CHAINED):
                self._held.append(line)
                self._marker = self._marker or line.startswith(_CHAINED)
                return []
            if not (self._marker and line.startswith(_TRACEBACK)):
                return self._decide() + self.feed(line)
            self._ended = self._marker = False  # the next traceback of the chain
        if len(self._held) >= MAX_HELD_LINES:
            return self._decide(keep=True) + self.feed(line)
        if line[:1] in (" ", "\t") or line.startswith(_TRACEBACK):
            self._held.append(line)
            return []
        if _EXCEPTION.match(line):
            self._held.append(line)
            self._ended = True
            return []
        return self._plain(line)  # another process's line inside the traceback

    def close(self) -> list[str]:
        return self._decide() if self._held else []

    def _decide(self, keep: bool = False) -> list[str]:
        held, self._held = self._held, []
        stop = any(h.startswith(_STOP_ERRORS) for h in held)
        pyspark = any(h.lstrip().startswith("File ") and "pyspark" in h for h in held)
        return held if keep or not (stop and pyspark) else []

    def _plain(self, line: str) -> list[str]:
        if line.startswith(_START_NOISE):
            return []
        if _WORKER_NOISE in line:
            self._after_noise = True
            return []
        if self._after_noise and not line.strip():
            return []
        self._after_noise = False
        return [line]


def _copy(read_fd: int, write_fd: int) -> None:
    noise = NoiseFilter()
    with open(read_fd, "rb", buffering=0) as pipe, open(write_fd, "wb", buffering=0) as out:
        for raw in pipe:
            for line in noise.feed(raw.decode("utf-8", "replace")):
                out.write(line.encode("utf-8"))
        for line in noise.close():
            out.write(line.encode("utf-8"))


@contextlib.contextmanager
def filtered_jvm_stderr() -> Iterator[None]:
    """Processes started inside the block (the JVM a session launches) write their
    stderr through :class:`NoiseFilter` to this process's stderr; this process's own
    stderr is restored when the block ends."""
    read_fd, write_fd = os.pipe()
    real = os.dup(2)
    copier = threading.Thread(target=_copy, args=(read_fd, os.dup(real)),
                              name="lowtide-jvm-stderr", daemon=True)
    copier.start()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield
    finally:
        os.dup2(real, 2)
        os.close(real)


def mute_accumulator_hangups() -> None:
    """The driver's accumulator server ends a connection the JVM closed without a
    traceback (see the module docstring); any other error is printed as before."""
    from pyspark import accumulators

    handler = accumulators.UpdateRequestHandler
    if getattr(handler, "_lowtide_quiet", False):
        return
    handle = handler.handle

    def handle_until_hangup(self: socketserver.StreamRequestHandler) -> None:
        with contextlib.suppress(EOFError):
            handle(self)  # type: ignore[arg-type]

    handler.handle = handle_until_hangup  # type: ignore[method-assign]
    handler._lowtide_quiet = True  # type: ignore[attr-defined]


#: Spark's error for a job cancelled because its query was stopped (by its user, or by
#: lowtide failing closed: a window's hold the tracker did not confirm)
_STOPPED = re.compile(r"SPARK_JOB_CANCELLED\].*Query \[id = [^\]]*\] was stopped")
#: a py4j call of the function (an Arrow collect waiting for its result) that the stop
#: interrupted: Spark's stop interrupts the query's thread, on which the function runs
_INTERRUPTED = re.compile(r"^: java\.lang\.InterruptedException", re.MULTILINE)


def stopped_under(error: BaseException | None) -> bool:
    """Was ``error`` a ``foreachBatch`` function's job cancelled by its query's stop,
    or its call into the JVM interrupted by it?

    >>> stopped_under(RuntimeError("[SPARK_JOB_CANCELLED] Job 3 cancelled Query [id = a, "
    ...                            "runId = b] was stopped SQLSTATE: XXKDA"))
    True
    >>> stopped_under(RuntimeError("An error occurred while calling o7.getResult.\\n"
    ...                            ": java.lang.InterruptedException\\n\\tat java.base"))
    True
    >>> stopped_under(RuntimeError("[SPARK_JOB_CANCELLED] Job 3 cancelled by the user"))
    False
    """
    text = "" if error is None else str(error)
    return bool(_STOPPED.search(text) or _INTERRUPTED.search(text))


class _ReportedErrors(logging.Filter):
    """Drops a log record of a lowtide error, raised in the function or in a task of
    the job it ran (Spark's error then carries the task's line): its query reports it
    as one line; and of a function whose job its query's stop cancelled (the stop
    is what the user asked for, or lowtide's one line says why)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (raised_in_task(error) is not None or stopped_under(error))


def mute_reported_errors() -> None:
    """py4j's callback server logs no traceback for a lowtide error a ``foreachBatch``
    function raised (see the module docstring)."""
    log = logging.getLogger("py4j.clientserver")
    if not any(isinstance(f, _ReportedErrors) for f in log.filters):
        log.addFilter(_ReportedErrors())
