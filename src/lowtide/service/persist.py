"""Write-ahead log and snapshots in ``state_dir``: exact recovery after ``kill -9``.

The server logs each group of applied requests followed by a Commit marker, writes it
out (and fsyncs, if asked) and only then confirms the requests and sends the
notifications their step produced. Recovery loads the newest snapshot and replays
every complete group after it through the engine's normal path; a group without its
Commit marker was never confirmed, so it is dropped and its senders resend it.

Files: ``snapshot.bin`` (engine state, and the number of the first log file it does
not cover) and ``wal-NNNNNNNN.log``. A snapshot starts a new log file first, then
replaces ``snapshot.bin`` atomically, then deletes the log files it covers: a crash at
any point leaves a snapshot plus the logs that follow it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path
from typing import BinaryIO

from lowtide.core.graph import SegmentGraph
from lowtide.service.engine import Engine, Logged
from lowtide.wire.log import decode_snapshot, encode_snapshot, read_records, record
from lowtide.wire.messages import Batch, Commit, FrontOp, ShardReleaseFrame, graph_of, graph_spec

log = logging.getLogger("lowtide.service.persist")

SNAPSHOT = "snapshot.bin"
GRAPH = "graph.json"
LOCK = "lock"


def _wal_name(index: int) -> str:
    return f"wal-{index:08d}.log"


def stored_graph(state_dir: Path) -> SegmentGraph | None:
    path = state_dir / GRAPH
    if not path.exists():
        return None
    spec = json.loads(path.read_text())
    return graph_of(tuple((name, tuple(ups)) for name, ups in spec))


def store_graph(state_dir: Path, graph: SegmentGraph) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    _atomic_write(state_dir / GRAPH, json.dumps(graph_spec(graph)).encode(), fsync=True)


def _atomic_write(path: Path, data: bytes, fsync: bool) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.replace(tmp, path)


class StateLog:
    def __init__(
        self,
        state_dir: Path,
        *,
        fsync: bool = False,
        snapshot_every_ms: int = 30_000,
        snapshot_every_records: int = 200_000,
    ) -> None:
        self.dir = state_dir
        self.fsync = fsync
        self.snapshot_every_ms = snapshot_every_ms
        self.snapshot_every_records = snapshot_every_records
        self._pending: list[bytes] = []
        self._file: BinaryIO | None = None
        self._index = 0
        self._records = 0
        self._last_snapshot_ms: int | None = None
        state_dir.mkdir(parents=True, exist_ok=True)
        self._lock = _lock_dir(state_dir)

    # ---------------------------------------------------------------- recover
    def recover(self, engine: Engine) -> int:
        """Load the snapshot and replay the logs into ``engine``; returns the number of
        groups replayed. Opens a fresh log file for what follows."""
        first = 0
        snap = self.dir / SNAPSHOT
        if snap.exists():
            meta, arrays = decode_snapshot(snap.read_bytes())
            engine.restore(meta["engine"], arrays)
            first = int(meta["next_wal"])
        groups = 0
        for index, path in self._wal_files():
            if index < first:
                continue
            groups += self._replay(path, engine)
            self._index = index + 1
        self._index = max(self._index, first)
        self._open_next()
        log.info("recovered", extra={"state_dir": str(self.dir), "groups": groups})
        return groups

    def _replay(self, path: Path, engine: Engine) -> int:
        data = path.read_bytes()
        group: list[Logged] = []
        groups, end = 0, 0
        for msg, stop in read_records(data):
            if isinstance(msg, Batch | FrontOp | ShardReleaseFrame):
                group.append(msg)
            elif isinstance(msg, Commit):
                for req in group:
                    engine.apply_logged(req, msg.now_ms)
                engine.step(msg.now_ms)
                group, groups, end = [], groups + 1, stop
        if end < len(data):
            log.warning(
                "dropped unconfirmed log tail", extra={"file": path.name, "bytes": len(data) - end}
            )
        return groups

    def _wal_files(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.dir.glob("wal-*.log"):
            stem = path.stem.removeprefix("wal-")
            if stem.isdigit():
                found.append((int(stem), path))
        return sorted(found)

    # ---------------------------------------------------------------- append
    def append(self, msg: Logged) -> None:
        self._pending.append(record(msg))

    def commit(self, now_ms: int) -> bool:
        """Write the pending group and its Commit marker; False if there was none."""
        if not self._pending:
            return False
        assert self._file is not None, "recover() opens the log"
        self._pending.append(record(Commit(now_ms)))
        self._file.write(b"".join(self._pending))
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())
        self._records += len(self._pending)
        self._pending = []
        return True

    # ---------------------------------------------------------------- snapshot
    def snapshot_due(self, now_ms: int) -> bool:
        if self._last_snapshot_ms is None:
            self._last_snapshot_ms = now_ms
        if self._records == 0:
            return False
        return (
            self._records >= self.snapshot_every_records
            or now_ms - self._last_snapshot_ms >= self.snapshot_every_ms
        )

    def snapshot(self, engine: Engine, now_ms: int) -> None:
        """Call between groups (nothing pending): the state then covers every log file
        before the one this opens."""
        covered = self._index
        self._open_next()
        meta, arrays = engine.export()
        data = encode_snapshot({"engine": meta, "next_wal": covered + 1}, arrays)
        _atomic_write(self.dir / SNAPSHOT, data, fsync=True)
        for index, path in self._wal_files():
            if index <= covered:
                path.unlink(missing_ok=True)
        self._records, self._last_snapshot_ms = 0, now_ms
        log.info("snapshot", extra={"bytes": len(data), "next_wal": covered + 1})

    def _open_next(self) -> None:
        if self._file is not None:
            self._file.close()
        self._index += 1
        self._file = open(self.dir / _wal_name(self._index), "ab")  # noqa: SIM115 (kept open)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._lock >= 0:
            os.close(self._lock)  # releases the lock
            self._lock = -1


class StateDirInUse(RuntimeError):
    """Another live server holds this state directory."""


def _lock_dir(state_dir: Path) -> int:
    """An exclusive lock for this process's life: two servers appending to one log
    would lose confirmed batches. The kernel drops it when the holder dies, even by
    ``kill -9``, so a restart never waits for a stale lock."""
    fd = os.open(state_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StateDirInUse(f"{state_dir} is in use by another lowtide server") from None
    return fd
