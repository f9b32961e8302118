"""The ingest log stays small: it rotates into files, and retention deletes only the
files every registered consumer committed; a read below what was deleted fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from lowtide.core.time import ManualClock
from lowtide.spark.sources.front import Front
from lowtide.spark.sources.ingest import IngestReader, IngestWriter, RecordsDeleted, log_files
from lowtide.spark.sources.log_source import LogStreamReader
from lowtide.spark.sources.retention import (
    commit_consumer,
    consumers,
    log_status,
    register_consumer,
    release_consumer,
    retain,
)
from lowtide.spark.tracking.transport import TrackerRef
from tests.spark.helpers import CoreAgent
from tests.spark.sources.helpers import GRAPH, GRID, T0


def fill(directory: Path, n: int) -> CoreAgent:
    """A front that wrote ``n`` one-record frames, a new log file every ~2 frames."""
    agent = CoreAgent(GRAPH, GRID)
    with Front(directory, 0, agent, grid=GRID, clock=ManualClock(T0), fsync="never",
               heartbeat_ms=None, rotate_bytes=100) as front:
        for i in range(n):
            front.send([b"record-%02d" % i])
    return agent


def test_the_log_rotates_and_reads_across_its_files(tmp_path: Path) -> None:
    fill(tmp_path, 10)
    assert len(log_files(tmp_path, 0)) > 3
    times, payloads = IngestReader(tmp_path, 0).read(0, 10)
    assert payloads.to_pylist() == [b"record-%02d" % i for i in range(10)]
    with IngestWriter(tmp_path, 0, fsync="never", rotate_bytes=100) as w:
        assert w.end_offset == 10 and w.last_time == int(times[-1])  # resumes the last file
        assert w.append([b"more"], time=int(times[-1])) == 10


def test_retention_deletes_only_what_every_consumer_committed(tmp_path: Path) -> None:
    fill(tmp_path, 10)
    files = log_files(tmp_path, 0)
    assert retain(tmp_path) == {0: 0}  # no consumer yet: a log nobody read is kept
    register_consumer(tmp_path, "fast", {0: 0})
    register_consumer(tmp_path, "slow", {0: 0})
    commit_consumer(tmp_path, "fast", {0: 10})
    commit_consumer(tmp_path, "slow", {0: 5})
    commit_consumer(tmp_path, "slow", {0: 3})  # a commit never moves back
    assert consumers(tmp_path) == {"fast": {0: 10}, "slow": {0: 5}}
    start = retain(tmp_path)[0]
    assert 0 < start <= 5  # whole files below the slow consumer's commit are gone
    assert [b for b in files if b >= start] == log_files(tmp_path, 0)
    reader = IngestReader(tmp_path, 0)
    assert reader.read(5, 10)[1].to_pylist() == [b"record-%02d" % i for i in range(5, 10)]
    with pytest.raises(RecordsDeleted, match="register a consumer"):
        reader.read(0, 5)
    status = log_status(tmp_path)[0]
    assert status["complete_offset"] == 5 and status["start_offset"] == start
    assert status["end_offset"] == 10 and status["committed"] == {"fast": 10, "slow": 5}
    commit_consumer(tmp_path, "slow", {0: 10})
    retain(tmp_path)
    assert log_files(tmp_path, 0) == files[-1:]  # never the file being written


def test_a_detached_consumer_no_longer_holds_the_log(tmp_path: Path) -> None:
    """A query detached from its pipeline (rule 16) releases its share of retention."""
    fill(tmp_path, 10)
    register_consumer(tmp_path, "kept", {0: 0})
    register_consumer(tmp_path, "detached", {0: 0})
    commit_consumer(tmp_path, "kept", {0: 10})
    assert retain(tmp_path) == {0: 0}          # the detached one's 0 holds every file
    release_consumer(tmp_path, "detached")
    assert consumers(tmp_path) == {"kept": {0: 10}} and retain(tmp_path)[0] > 0


def test_a_query_of_the_log_registers_and_commits_as_a_consumer(tmp_path: Path) -> None:
    fill(tmp_path, 10)
    ref = TrackerRef("memory://unused", GRAPH, GRID)
    options = {"path": str(tmp_path), "lowtide.tracker": ref.to_option(),
               "lowtide.segment": "ingest", "lowtide.out": "sink"}
    a = LogStreamReader(options)
    b = LogStreamReader({**options, "lowtide.segment": "ingest_b"})
    assert a.initialOffset() == b.initialOffset() == {"f0": 0}
    assert consumers(tmp_path) == {"ingest": {0: 0}, "ingest_b": {0: 0}}
    a.commit({"f0": 10})
    assert IngestReader(tmp_path, 0).start_offset() == 0  # ingest_b has read nothing
    b.commit({"f0": 10})
    assert IngestReader(tmp_path, 0).start_offset() > 0


def test_retention_log_prints_what_every_consumer_committed(tmp_path: Path, capsys) -> None:
    import json

    from lowtide.cli import main

    fill(tmp_path, 4)
    register_consumer(tmp_path, "q", {0: 0})
    commit_consumer(tmp_path, "q", {0: 3})
    assert main(["retention", "log", "--dir", str(tmp_path)]) == 0
    status = json.loads(capsys.readouterr().out)["0"]
    assert status["complete_offset"] == 3 and status["end_offset"] == 4
