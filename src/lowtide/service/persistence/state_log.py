"""Write-ahead log and snapshots in ``state_dir``: exact recovery after ``kill -9``.

The server logs each group of requests (applied ones, and refusals) followed by a
Commit marker, writes it out (and fsyncs, if asked) and only then confirms the
requests and sends the notifications their step produced. Recovery loads the newest
snapshot and replays every complete group after it through the engine's normal path.

The files (:mod:`.state_dir`): ``snapshot.bin`` and ``wal-NNNNNNNN.log`` here. A
snapshot starts a new log file first, then replaces ``snapshot.bin`` atomically, then
deletes the log files it covers: a crash at any point leaves a snapshot plus the
consecutive logs that follow it.

Recovery trusts nothing it cannot prove (rule 10). Only the tail of the *last* log
file after its last Commit may be dropped, and only if a crash tore it (see
:func:`lowtide.wire.log.torn_at`): nothing there was confirmed, its senders resend it.
Any other damage (a flipped byte before a Commit, a bad first file, a missing log
file or snapshot, a state dir of another graph or format) refuses to start with
:class:`~.state_dir.StateDirRefused`, one line naming the file and offset, and the way
out.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from lowtide.service.engine.base import Engine, Logged
from lowtide.service.persistence.state_dir import (
    SNAPSHOT,
    atomic_write,
    bind,
    lock_dir,
    open_private,
    private_dir,
    refusal,
    state_file,
    wal_name,
    write_all,
)
from lowtide.wire.buffers import WireError
from lowtide.wire.log import decode_snapshot, encode_snapshot, read_records, record, torn_at
from lowtide.wire.messages import Commit

log = logging.getLogger("lowtide.service.persist")

SNAPSHOT_RETRY_MS = 1_000


def apply_group(engine: Engine, group: list[Logged], now_ms: int) -> str | None:
    """Replay one logged group and its step at ``now_ms``, as the server ran them;
    a graph change that no longer applies stops it and says why (rule 16)."""
    for req in group:
        refused = engine.apply_logged(req, now_ms)
        if refused is not None:
            return refused
    engine.step(now_ms)
    return None


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
        self._fd = -1  # unbuffered: nothing of a failed group is written later
        self._index = 0
        self._records = 0
        self._last_snapshot_ms: int | None = None
        self._retry_ms = 0  # after a failed snapshot, none is due before this
        self._broken: str | None = None
        private_dir(state_dir)
        state_file(state_dir)  # refuse a directory of another format before anything
        self._lock = lock_dir(state_dir)

    # ---------------------------------------------------------------- recover
    def recover(self, engine: Engine) -> int:
        """Load the snapshot and replay the logs into ``engine``; returns the number of
        groups replayed. Opens a fresh log file for what follows, and from then on
        logs the engine's refusals too."""
        bind(self.dir, engine.graph.fingerprint(), engine.identity())
        first = 1
        snap = self.dir / SNAPSHOT
        if snap.exists():
            try:
                meta, arrays = decode_snapshot(snap.read_bytes())
                engine.restore(meta["engine"], arrays)
                first = int(meta["next_wal"])
            except (WireError, KeyError, TypeError, ValueError) as exc:
                raise refusal(snap, 0, f"unreadable snapshot ({exc})") from None
        files = [(i, p) for i, p in self._wal_files() if i >= first]
        for expected, (index, _path) in enumerate(files, start=first):
            if index != expected:
                missing = self.dir / wal_name(expected)
                raise refusal(missing, 0, "missing log file (or the snapshot covering it)")
        if not files and first > 1:
            raise refusal(self.dir / wal_name(first), 0, "missing log file")
        groups = 0
        for n, (index, path) in enumerate(files):
            groups += self._replay(path, engine, last=n == len(files) - 1)
            self._index = index
        self._index = max(self._index, first - 1)
        self._open_next()
        engine.on_refused = self.append
        log.info("recovered", extra={"state_dir": str(self.dir), "groups": groups})
        return groups

    def _replay(self, path: Path, engine: Engine, last: bool) -> int:
        data = path.read_bytes()
        group: list[Logged] = []
        groups, confirmed, stop = 0, 0, 0
        for msg, stop in read_records(data):
            if isinstance(msg, Commit):
                refused = apply_group(engine, group, msg.now_ms)
                if refused is not None:  # a generation that does not follow (rule 16)
                    raise refusal(path, confirmed, refused)
                group, groups, confirmed = [], groups + 1, stop
            elif isinstance(msg, Logged):
                group.append(msg)
            else:
                raise refusal(path, stop, f"unexpected {type(msg).__name__} record")
        if confirmed == len(data):
            return groups
        if not last:
            raise refusal(path, confirmed, "damaged or unconfirmed records in a log file "
                           "that is not the last")
        if stop < len(data) and not torn_at(data, stop):
            raise refusal(path, stop, "damaged record (not the torn tail of a crash)")
        # A crash tore the last write: nothing from here on was confirmed. Cut it off,
        # so that this file ends on a Commit once a new file follows it.
        log.warning("dropped unconfirmed log tail",
                    extra={"file": path.name, "offset": confirmed, "bytes": len(data) - confirmed})
        os.truncate(path, confirmed)
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

    def mark(self, now_ms: int) -> None:
        """A Commit marker even without requests: replay then steps at ``now_ms``, as
        the server did (a step that retired a dead front, rule 17)."""
        self.commit(now_ms, force=True)

    def commit(self, now_ms: int, force: bool = False) -> bool:
        """Write the pending group and its Commit marker; False if there was none.
        If the write fails (a full disk), the file is cut back to where the group
        began and the log refuses every later group: what was not logged was never
        confirmed, and a restart must not find half of it."""
        if not self._pending and not force:
            return False
        assert self._fd >= 0, "recover() opens the log"
        if self._broken is not None:
            raise OSError(f"the write-ahead log failed earlier: {self._broken}")
        self._pending.append(record(Commit(now_ms)))
        records, data, self._pending = len(self._pending), b"".join(self._pending), []
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            write_all(self._fd, data)
            if self.fsync:
                os.fsync(self._fd)
        except OSError as exc:
            self._broken = repr(exc)
            os.ftruncate(self._fd, start)
            raise
        self._records += records
        return True

    # ---------------------------------------------------------------- snapshot
    def snapshot_due(self, now_ms: int) -> bool:
        if self._last_snapshot_ms is None:
            self._last_snapshot_ms = now_ms
        if self._records == 0 or now_ms < self._retry_ms:
            return False
        return (
            self._records >= self.snapshot_every_records
            or now_ms - self._last_snapshot_ms >= self.snapshot_every_ms
        )

    def snapshot(self, engine: Engine, now_ms: int) -> None:
        """Call between groups (nothing pending): the state then covers every log file
        before the one this opens. One that fails (no descriptor or disk space left)
        raises OSError and is due again :data:`SNAPSHOT_RETRY_MS` later; meanwhile the
        log holds everything since the last snapshot, so nothing is lost."""
        covered = self._index
        try:
            self._open_next()
            meta, arrays = engine.export()
            data = encode_snapshot({"engine": meta, "next_wal": covered + 1}, arrays)
            atomic_write(self.dir / SNAPSHOT, data, fsync=True)
        except OSError:
            self._retry_ms = now_ms + SNAPSHOT_RETRY_MS
            raise
        for index, path in self._wal_files():
            if index <= covered:
                path.unlink(missing_ok=True)
        self._records, self._last_snapshot_ms = 0, now_ms
        log.info("snapshot", extra={"bytes": len(data), "next_wal": covered + 1})

    def _open_next(self) -> None:
        """Open the next log file, then close this one: if the open fails (no descriptor
        left), the log goes on in the file it had."""
        fd = open_private(self.dir / wal_name(self._index + 1), os.O_WRONLY | os.O_APPEND)
        if self._fd >= 0:
            os.close(self._fd)
        self._index += 1
        self._fd = fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock >= 0:
            os.close(self._lock)  # releases the lock
            self._lock = -1
