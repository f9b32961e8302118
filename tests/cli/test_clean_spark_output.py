"""A normal run of lowtide's Spark commands prints no stack trace, no Spark ERROR
line, no Python BrokenPipe traceback and no Python-runner chatter (issue 23 point 5):
Spark is quiet from its first line (SessionConfig's log4j2 file, the JVM's stderr
filtered by lowtide.spark.quiet) and queries stop between batches."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import run_clean

pytestmark = pytest.mark.spark


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
