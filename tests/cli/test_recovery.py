"""``lowtide replay`` (locating a loss in the ingest log) and ``lowtide cut`` (the
manifest of a consistent cut of tracked tables), without Spark: a stuck report and a
log, tables written by hand as the table sinks write them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lowtide.spark.sinks.completeness import Record
from lowtide.spark.sinks.cuts import CutRefused, cut, sink_cut
from lowtide.spark.sinks.table_formats import ParquetTable
from lowtide.spark.sources.ingest import IngestWriter

LOWTIDE = [sys.executable, "-m", "lowtide.cli"]
DELTA_MS = 10


def lowtide(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LOWTIDE, *argv], capture_output=True, text=True, timeout=120)


def test_replay_names_the_offsets_of_a_stuck_window(tmp_path: Path) -> None:
    log = tmp_path / "log"
    for front, times in ((0, [100, 100, 101, 103]), (1, [99, 101, 102])):
        with IngestWriter(log, front, fsync="never") as w:
            for t in times:
                w.append([b"x"], time=t)
    status = {"delta_ms": DELTA_MS, "stuck_detail": [
        {"segment": "sink", "window_start": 101, "window_end": 102, "missing": 2, "extra": 0},
        {"segment": "sink", "window_start": 103, "window_end": 104, "missing": 0, "extra": 1}]}
    (tmp_path / "status.json").write_text(json.dumps(status))
    done = lowtide("replay", "--status", str(tmp_path / "status.json"), "--log", str(log))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("segment 'sink', 1970-01-01T00:00:01.010000+00:00 to ")
    assert lines[0].endswith("2 item(s) missing; replay front 0 offsets [2, 3), "
                             "front 1 offsets [1, 2)")
    # a window with extra items only is no loss a replay completes
    assert json.loads(lines[-1]) == {"losses": [{"segment": "sink", "start": 101, "end": 102,
                                                 "missing": 2,
                                                 "offsets": {"0": [2, 3], "1": [1, 2]}}]}


def table(folder: Path, writer: str, complete: int, batches: dict[int, list[int]]) -> None:
    """A Parquet table as ``write_table`` leaves it: one file per batch, the writer's
    record in the manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    for batch, times in batches.items():
        rows = pa.table({"v": np.arange(len(times)), "lt_time": np.array(times, np.int64),
                         "lt_ack": np.arange(len(times), dtype=np.int64)})
        pq.write_table(rows, folder / f"part-q-{writer}-{batch:010d}.parquet")
    record = Record(writer, complete, complete * DELTA_MS, 0, "g", writer, max(batches), "q")
    ParquetTable(str(folder)).publish(record, floor=None)


def test_cut_names_the_batches_below_t_and_refuses_a_table_behind(tmp_path: Path) -> None:
    bronze, gold = tmp_path / "bronze", tmp_path / "gold"
    table(bronze, "bronze", 120, {0: [100, 101], 1: [105, 118], 2: [119, 125]})
    table(gold, "gold", 110, {0: [100], 1: [109, 130]})
    share = sink_cut(bronze, 110)
    assert [(f.file, f.rows, f.batch) for f in share.files] == [
        ("part-q-bronze-0000000000.parquet", 2, 0), ("part-q-bronze-0000000001.parquet", 1, 1)]
    assert share.batches() == [{"query": "q-bronze", "batch": 0, "version": None},
                               {"query": "q-bronze", "batch": 1, "version": None}]
    out = tmp_path / "cut.json"
    done = lowtide("cut", "--as-of", str(110 * DELTA_MS), "--table", str(bronze),
                   "--table", str(gold), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"manifest": str(out), "sinks": 2, "rows": 5}
    manifest = json.loads(out.read_text())
    assert manifest["as_of_slot"] == 110 and manifest["as_of_ms"] == 1100
    assert [s["rows"] for s in manifest["sinks"]] == [3, 2]
    # gold is complete below 110 only: a cut at 115 would claim rows it may still get
    done = lowtide("cut", "--as-of", "1970-01-01T00:00:01.150", "--table", str(bronze),
                   "--table", str(gold))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"lowtide cut: cut at slot 115 refused: {gold} is complete "
                                   "below slot 110 only (writer 'gold' holds it back): wait for "
                                   "it, or cut earlier")
    try:
        cut([str(bronze), str(tmp_path / "plain")], 100, delta_ms=DELTA_MS)
    except CutRefused as err:
        assert "publishes no completeness" in str(err)
    else:
        raise AssertionError("a folder without a completeness was cut")


def test_a_delta_cut_reads_the_first_version_complete_below_t(tmp_path: Path) -> None:
    """The log as a Delta writer leaves it (JSON commits: add, remove, lowtide's record
    in commitInfo), read without Spark: the version is the first whose record reached T,
    and the files are those live at that version."""
    t = tmp_path / "gold"
    (t / "_delta_log").mkdir(parents=True)

    def commit(version: int, complete: int, batch: int, adds: dict[str, list[int]],
               removes: tuple[str, ...] = ()) -> None:
        record = Record("gold", complete, complete * DELTA_MS, 0, "g", "gold", batch, "q1")
        lines = [{"commitInfo": {"userMetadata": json.dumps({"lowtide": record.doc()})}}]
        for name, times in adds.items():
            pq.write_table(pa.table({"lt_time": np.array(times, np.int64)}), t / name)
            lines.append({"add": {"path": name}})
        lines += [{"remove": {"path": name}} for name in removes]
        text = "\n".join(json.dumps(line) for line in lines) + "\n"
        (t / "_delta_log" / f"{version:020d}.json").write_text(text)

    commit(0, 0, -1, {})
    commit(1, 100, 0, {"a.parquet": [100, 101]})
    commit(2, 110, 1, {"b.parquet": [105, 120]})
    commit(3, 130, 2, {"ab.parquet": [100, 101, 105, 120]}, removes=("a.parquet", "b.parquet"))
    share = sink_cut(t, 106)
    assert (share.format, share.version, share.complete_below) == ("delta", 2, 110)
    assert [(f.file, f.rows, f.batch, f.version) for f in share.files] == [
        ("a.parquet", 2, 0, 1), ("b.parquet", 1, 1, 2)]
    later = sink_cut(t, 125)  # after the compaction: its file only
    assert (later.version, [(f.file, f.rows) for f in later.files]) == (3, [("ab.parquet", 4)])
    try:
        sink_cut(t, 131)
    except CutRefused as err:
        assert "complete below slot 130 only (writer 'gold' holds it back)" in str(err)
    else:
        raise AssertionError("a cut past the table's completeness was not refused")
