"""Muting PySpark's Python-worker noise (``SessionConfig(quiet=True)``).

Log4j settings quiet the JVM, but not what Spark's Python processes print: the JVM
copies their output to its own stderr line by line, and Spark has no setting for it.
``transformWithStateInPandas``'s driver-side runner prints five lines with object
reprs each time a stateful query starts, and a driver-side data source runner whose
JVM end closes while a query stops can print a ``BrokenPipeError`` traceback. The JVM
also starts with three lines of its own (an incubator module warning, and Spark saying
it set the log level to WARN, which lowtide's log configuration overrides). A
lowtide command's user should see none of them.

:func:`filtered_jvm_stderr` launches the JVM with its stderr on a pipe; a thread
copies each line to the real stderr, in order, except what :class:`NoiseFilter`
drops. Everything else (Spark's own error lines, a real traceback) passes unchanged.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

__all__ = ["NoiseFilter", "filtered_jvm_stderr"]

_WORKER_NOISE = "TransformWithStateInPandas Python worker"
_START_NOISE = ("WARNING: Using incubator modules:", "Setting default log level to",
                "To adjust logging level use sc.setLogLevel")
#: a runner's end of a socket the JVM already closed: a query stopping, not a failure
_STOP_ERRORS = ("BrokenPipeError", "ConnectionResetError")
_TRACEBACK = "Traceback (most recent call last):"
#: a traceback longer than this is passed on as it is (never held without bound)
MAX_HELD_LINES = 400


class NoiseFilter:
    """Line filter: ``feed(line)`` returns the lines to pass on now (a traceback is
    held until its exception line says whether it is noise); ``close()`` the rest.

    >>> f = NoiseFilter()
    >>> f.feed("Starting Streaming TransformWithStateInPandas Python worker.\\n")
    []
    >>> f.feed("\\n")  # the runner's print adds an empty line to each message
    []
    >>> f.feed("Traceback (most recent call last):\\n") + f.feed('  File "x.py"\\n')
    []
    >>> f.feed("BrokenPipeError: [Errno 32] Broken pipe\\n")
    []
    >>> f.feed("ERROR something real\\n")
    ['ERROR something real\\n']
    """

    def __init__(self) -> None:
        self._held: list[str] = []
        self._after_noise = False

    def feed(self, line: str) -> list[str]:
        if self._held:
            self._held.append(line)
            if line[:1] in (" ", "\t") and len(self._held) < MAX_HELD_LINES:
                return []
            held, self._held = self._held, []
            return [] if line.startswith(_STOP_ERRORS) else held
        if line.startswith(_TRACEBACK):
            self._held = [line]
            return []
        if line.startswith(_START_NOISE):
            return []
        if _WORKER_NOISE in line:
            self._after_noise = True
            return []
        if self._after_noise and not line.strip():
            return []
        self._after_noise = False
        return [line]

    def close(self) -> list[str]:
        held, self._held = self._held, []
        return held


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
