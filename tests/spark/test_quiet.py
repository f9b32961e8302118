"""The filter that mutes Spark's Python-runner noise in lowtide's commands passes
everything else on, in order (no Spark, no processes)."""

from __future__ import annotations

from lowtide.spark.quiet import MAX_HELD_LINES, NoiseFilter


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


def test_an_unfinished_or_endless_traceback_is_passed_on() -> None:
    assert run(REAL[:2]) == REAL[:2]  # the process died mid-traceback: keep what came
    endless = ["Traceback (most recent call last):\n"] + ["  frame\n"] * MAX_HELD_LINES
    assert run([*endless, "BrokenPipeError: x\n"]) == [*endless, "BrokenPipeError: x\n"]
