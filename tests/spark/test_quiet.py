"""The filter that mutes Spark's Python-runner noise in lowtide's commands passes
everything else on, in order (no Spark, no processes); the driver's accumulator server
ends a connection the JVM closed quietly (a real socket); py4j logs no traceback for a
lowtide error a ``foreachBatch`` function raised, but does for any other."""

from __future__ import annotations

import logging
import socket
import struct
import time

import pytest

from lowtide.core.errors import LowtideError
from lowtide.spark.quiet import (
    MAX_HELD_LINES,
    NoiseFilter,
    mute_accumulator_hangups,
    mute_reported_errors,
)


def run(lines: list[str]) -> list[str]:
    f = NoiseFilter()
    out = [kept for line in lines for kept in f.feed(line)]
    return out + f.close()


RUNNER = [
    "Starting Streaming TransformWithStateInPandas Python worker.\n", "\n",
    "Streaming TransformWithStateInPandas Python worker finish init stage of Python "
    "runner. Received UDF from JVM: <bound method ...>\n", "\n",
]
BROKEN_PIPE = [
    "Traceback (most recent call last):\n",
    '  File "/x/pyspark/sql/worker/python_streaming_source_runner.py", line 9, in main\n',
    "    write_int(0, outfile)\n",
    "BrokenPipeError: [Errno 32] Broken pipe\n",
]
REAL = [
    "Traceback (most recent call last):\n",
    '  File "job.py", line 3, in <module>\n',
    "ValueError: a real failure\n",
]


def test_runner_lines_and_start_up_chatter_are_muted() -> None:
    start = ["WARNING: Using incubator modules: jdk.incubator.vector\n",
             'Setting default log level to "WARN".\n',
             "To adjust logging level use sc.setLogLevel(newLevel).\n"]
    assert run([*start, *RUNNER, "12:00:01 ERROR Executor: real\n"]) == [
        "12:00:01 ERROR Executor: real\n"]


def test_a_blank_line_not_after_runner_noise_is_kept() -> None:
    assert run(["a\n", "\n", *RUNNER, "b\n", "\n"]) == ["a\n", "\n", "b\n", "\n"]


def test_a_broken_pipe_at_stop_is_muted_a_real_traceback_is_not() -> None:
    assert run([*BROKEN_PIPE, *REAL, "after\n"]) == [*REAL, "after\n"]
    reset = [*BROKEN_PIPE[:-1], "ConnectionResetError: [Errno 104] reset by peer\n"]
    assert run(reset) == []
    # a worker that started after the JVM stopped waiting (the query's error says so)
    late = [*BROKEN_PIPE[:-1], "ConnectionRefusedError: [Errno 111] Connection refused\n"]
    assert run(late) == []


def test_an_unfinished_or_endless_traceback_is_passed_on() -> None:
    assert run(REAL[:2]) == REAL[:2]  # the process died mid-traceback: keep what came
    endless = ["Traceback (most recent call last):\n"] + ["  frame\n"] * MAX_HELD_LINES
    assert run([*endless, "BrokenPipeError: x\n"]) == [*endless, "BrokenPipeError: x\n"]


def test_a_chained_broken_pipe_with_other_processes_lines_inside_is_muted() -> None:
    """What `bench spark --shape join` printed at a stop: a runner's chained traceback,
    another process's runner line written into its middle."""
    chained = [*BROKEN_PIPE, "\n", "During handling of the above exception, another "
               "exception occurred:\n", "\n", "Traceback (most recent call last):\n",
               '  File "<frozen runpy>", line 198, in _run_module_as_main\n', *RUNNER[:2],
               '  File "/x/pyspark/worker_util.py", line 9, in main\n',
               "OSError: [Errno 9] Bad file descriptor\n", "\n"]
    assert run([*chained, "after\n"]) == ["after\n"]


def test_a_broken_pipe_outside_pyspark_and_a_new_traceback_are_kept() -> None:
    mine = ["Traceback (most recent call last):\n", '  File "my_sink.py", line 4\n',
            "BrokenPipeError: [Errno 32] Broken pipe\n"]
    assert run(mine) == mine  # the user's own socket: a real error
    assert run([*BROKEN_PIPE, *REAL]) == REAL  # no "During handling": not one chain


@pytest.mark.socket
def test_a_jvm_closing_its_accumulator_socket_ends_without_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pyspark import accumulators

    mute_accumulator_hangups()
    server = accumulators._start_update_server("token", is_unix_domain_sock=False)
    try:
        with socket.create_connection(server.server_address, timeout=10) as jvm:
            jvm.sendall(b"token" + struct.pack("!i", 0))  # authenticated, no updates
            assert jvm.recv(1) == b"\x01"
        time.sleep(1.5)  # the server polls each second, then reads the end of the socket
    finally:
        server.shutdown()
    assert "Traceback" not in capsys.readouterr().err


def test_py4j_logs_a_user_functions_error_but_not_a_lowtide_one_or_a_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mute_reported_errors()
    mute_reported_errors()  # once is enough: no second filter
    log = logging.getLogger("py4j.clientserver")
    assert len(log.filters) == 1
    in_task = RuntimeError("PythonException: Traceback (most recent call last):\n"
                           "lowtide.spark.tracking.task_errors.TaskAcksFailed: one line\n")
    stopped = RuntimeError("An error occurred while calling o1.getResult.\n: org.apache."
                           "spark.SparkException: Exception thrown in awaitResult: \n"
                           "Caused by: org.apache.spark.SparkException: [SPARK_JOB_CANCELLED] "
                           "Job 303 cancelled Query [id = b1a0, runId = 1709] was stopped "
                           "SQLSTATE: XXKDA")
    # the stop interrupted the function's Arrow collect (a window's results from the
    # driver, its hold failed closed): py4j's error, from the JVM's getResult
    interrupted = RuntimeError("An error occurred while calling o21886.getResult.\n"
                               ": java.lang.InterruptedException\n\tat java.base/java.util."
                               "concurrent.locks.AbstractQueuedSynchronizer")
    for error in (LowtideError("the query reports this line"), in_task, stopped,
                  interrupted, ValueError("a user's bug")):
        try:
            raise error
        except Exception:
            log.exception("There was an exception while executing the Python Proxy")
    assert [r.exc_info[1] for r in caplog.records if r.exc_info] == [error]
