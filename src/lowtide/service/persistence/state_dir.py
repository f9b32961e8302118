"""A tracker's state directory: which files it holds, whose state they are, and who
may use it.

Files: ``state.json`` (format version, graph fingerprint, and the engine's grid and
shard place), ``graph.json``, ``snapshot.bin`` (engine state, and the number of the
first log file it does not cover), ``wal-NNNNNNNN.log`` (:mod:`.state_log`) and
``lock``. The directory is created 0700 and every file 0600. A directory of another
graph, format, grid or shard layout is refused (:class:`StateDirRefused`), and so is
one another live server holds (:class:`StateDirInUse`, an exclusive lock the kernel
drops when its holder dies, even by ``kill -9``).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

from lowtide.core.errors import LowtideError
from lowtide.core.graph import SegmentGraph
from lowtide.wire.messages import graph_of, graph_spec

SNAPSHOT = "snapshot.bin"
GRAPH = "graph.json"
STATE = "state.json"
LOCK = "lock"
#: Bumped when the log or snapshot format changes; a state dir of another is refused.
FORMAT_VERSION = 2
WAY_OUT = (
    "restore the state dir from a backup, or move it away and start with an empty one "
    "(then re-run the queries from their start)"
)


class StateDirError(LowtideError, RuntimeError):
    """The state directory cannot be used; the message is one line. ``exit_code``:
    what `lowtide serve` exits with."""

    exit_code = 1


class StateDirInUse(StateDirError):
    """Another live server holds this state directory (it may be on its way out)."""


class StateDirRefused(StateDirError):
    """Recovery cannot prove the state it would load: it refuses to start, for good."""

    exit_code = 3


def wal_name(index: int) -> str:
    return f"wal-{index:08d}.log"


def stored_graph(state_dir: Path) -> SegmentGraph | None:
    path = state_dir / GRAPH
    if not path.exists():
        return None
    spec = json.loads(path.read_text())
    return graph_of(spec)


def store_graph(state_dir: Path, graph: SegmentGraph) -> None:
    """Bind ``state_dir`` to ``graph`` (and this format), or refuse if it belongs to
    another graph or format, or holds state without saying whose."""
    private_dir(state_dir)
    bind(state_dir, graph.fingerprint())
    atomic_write(state_dir / GRAPH, json.dumps(graph_spec(graph)).encode(), fsync=True)


def bind(state_dir: Path, fingerprint: str, identity: dict[str, Any] | None = None) -> None:
    """Check ``state.json`` against this graph and (``identity``) this engine's time
    grid and shard layout, recording what it does not say yet."""
    found = state_file(state_dir)
    state = found or {"format": FORMAT_VERSION, "graph": fingerprint}
    if state["graph"] != fingerprint:
        raise StateDirRefused(
            f"{state_dir} holds the state of another pipeline graph (fingerprint "
            f"{state['graph']}, this one {fingerprint}): use the graph it was written for, "
            f"or another state dir"
        )
    earlier = state.get("engine")
    if identity is not None and earlier is not None and earlier != identity:
        raise StateDirRefused(
            f"{state_dir} was written by a tracker with {earlier}, this one has {identity}: "
            "start it with the same grid (--delta-ms, --window-slots) and shard layout, or "
            "use another state dir"
        )
    if found is None or (identity is not None and earlier is None):
        state = {**state, "engine": identity} if identity is not None else state
        atomic_write(state_dir / STATE, json.dumps(state).encode(), fsync=True)


def state_file(state_dir: Path) -> dict[str, Any] | None:
    """``state.json``, checked; None in a directory that holds no state yet. A
    directory with a log or snapshot but no readable state.json is refused."""
    path = state_dir / STATE
    if not path.exists():
        if (state_dir / SNAPSHOT).exists() or any(state_dir.glob("wal-*.log")):
            raise refusal(path, 0, "missing, so the log and snapshot here cannot be checked")
        return None
    try:
        found: dict[str, Any] = json.loads(path.read_bytes())
        fmt = int(found["format"])
        str(found["graph"])
    except (ValueError, KeyError, TypeError):
        raise refusal(path, 0, "damaged") from None
    if fmt != FORMAT_VERSION:
        raise refusal(path, 0, f"written in format {fmt}, this lowtide reads {FORMAT_VERSION}")
    return found


def refusal(path: Path, offset: int, what: str) -> StateDirRefused:
    """The one-line refusal of damage at ``offset`` in ``path``, with the way out."""
    return StateDirRefused(f"{path}: {what} (at byte {offset}); recovery refuses to start: "
                           f"{WAY_OUT}")


def private_dir(path: Path) -> None:
    """Create ``path`` and any missing parents 0700 (mkdir's ``parents`` would leave
    the parents to the umask); directories that exist are left as they are."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir(mode=0o700, exist_ok=True)


def open_private(path: Path, flags: int) -> int:
    return os.open(path, flags | os.O_CREAT, 0o600)


def atomic_write(path: Path, data: bytes, fsync: bool) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]



def lock_dir(state_dir: Path) -> int:
    """An exclusive lock for this process's life: two servers appending to one log
    would lose confirmed batches. The kernel drops it when the holder dies, even by
    ``kill -9``, so a restart never waits for a stale lock."""
    fd = open_private(state_dir / LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StateDirInUse(f"{state_dir} is in use by another lowtide server") from None
    return fd
