"""A normal run of lowtide's Spark commands prints no stack trace, no Spark ERROR
line, no Python BrokenPipe traceback and no Python-runner chatter (issue 23 point 5):
Spark is quiet from its first line (SessionConfig's log4j2 file, the JVM's stderr
filtered by lowtide.spark.quiet) and queries stop between batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark

LOWTIDE = [sys.executable, "-m", "lowtide.cli"]
NOISE = ("Traceback", " ERROR ", "BrokenPipe", "Exception in thread",
         "TransformWithStateInPandas Python worker", "Setting default log level")


def run_clean(*argv: str) -> str:
    """Run a command; assert it succeeded without noise; its stdout."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run([*LOWTIDE, *argv], capture_output=True, text=True, timeout=600,
                          env=env)
    both = done.stdout + done.stderr
    assert done.returncode == 0, both[-3000:]
    lines = both.splitlines()
    noisy = [i for i, line in enumerate(lines) if any(n in line for n in NOISE)]
    # the whole first stack trace, so a rare one says where it came from
    assert noisy == [], "\n".join(lines[max(0, noisy[0] - 5):noisy[0] + 60])
    return done.stdout


@pytest.mark.slow  # ~1-1.5 min; tests/apps/test_demo.py checks `lowtide demo` clean
def test_spark_demo_is_clean() -> None:
    out = run_clean("spark", "demo", "--seconds", "4", "--fronts", "2", "--rate", "200")
    assert "segment" in out


@pytest.mark.slow  # ~40-95 s; the demo is checked clean by default
def test_bench_spark_is_clean() -> None:
    out = run_clean("bench", "spark", "--seconds", "1", "--rounds", "2", "--stages", "1",
                    "--rows-per-batch", "5000", "--warmup-batches", "2")
    assert json.loads(out.strip().splitlines()[-1])["bench"] == "spark"


def test_walkthrough_is_clean() -> None:
    out = run_clean("walkthrough")
    assert json.loads(out.strip().splitlines()[-1])["stuck"]
