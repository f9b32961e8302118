"""Fronts writing files: one whole file per batch under its final name, label columns
inside, heartbeats only after the rename; a failed write holds the front."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lowtide.core.time import ManualClock
from lowtide.spark.sources.files_producer import FilesProducerConfig
from lowtide.spark.sources.front import Front
from tests.spark.helpers import CoreAgent
from tests.spark.sources.helpers import GRAPH, GRID, T0, receive


def make_front(agent: CoreAgent, clock: ManualClock) -> Front:
    return Front(None, 3, agent, grid=GRID, clock=clock, heartbeat_ms=None)


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_each_batch_is_one_labelled_file_and_receipts_complete_it(tmp_path: Path, fmt) -> None:
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(T0)
    front = make_front(agent, clock)
    out = FilesProducerConfig(tmp_path / "in", format=fmt).build(front)
    first = out.send(pd.DataFrame({"v": [1, 2]}))
    clock.advance(20)
    second = out.send(pa.table({"v": [3]}))
    files = sorted((tmp_path / "in").iterdir())
    assert [f.suffix for f in files] == [f".{fmt}"] * 2  # no temporary file is left
    if fmt == "parquet":
        rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    else:
        rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert [r["v"] for r in rows] == [1, 2, 3]
    assert [r["lt_ack"] for r in rows] == [*first.acks.tolist(), *second.acks.tolist()]
    clock.advance(20)
    assert front.heartbeat() == 100_004
    receive(agent, "ingest", [r["lt_time"] for r in rows], [r["lt_ack"] for r in rows])
    assert agent.step()["ingest"] == 100_004


def test_bytes_go_to_a_value_column_in_parquet_only(tmp_path: Path) -> None:
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(T0)
    front = make_front(agent, clock)
    FilesProducerConfig(tmp_path / "p").build(front).send([b"a", b"b"])
    (path,) = (tmp_path / "p").iterdir()
    assert pq.read_table(path).column("value").to_pylist() == [b"a", b"b"]
    with pytest.raises(TypeError, match="format='parquet'"):
        FilesProducerConfig(tmp_path / "j", format="json").build(front).send([b"a"])


def test_a_failed_write_leaves_no_file_and_holds_the_front(tmp_path: Path) -> None:
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(T0)
    front = make_front(agent, clock)
    out = FilesProducerConfig(tmp_path / "in").build(front)
    with pytest.raises(pa.ArrowInvalid):
        out.send(pd.DataFrame({"v": [1, "x"]}))  # a column Parquet cannot hold
    assert list((tmp_path / "in").iterdir()) == []
    clock.advance(100)
    assert front.heartbeat() == 100_000 and front.status()["in_flight"] == 2
