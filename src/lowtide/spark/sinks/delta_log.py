"""lowtide's records in a Delta table's log, read without Spark: the commits after a
version, and a replayed state saved every :data:`STATE_EVERY` versions under
``_lowtide_state/`` (Delta ignores files its log does not name), so a reader replays
only the commits since the newest one instead of the whole log.

The state is whatever :class:`lowtide.spark.sinks.completeness.TableState` saves; any
writer may save it (the replay is deterministic: two writers saving the same version
write the same text).

>>> import tempfile
>>> table = Path(tempfile.mkdtemp())
>>> (table / "_delta_log").mkdir()
>>> info = {"commitInfo": {"userMetadata": json.dumps({META_KEY: {"writer": "a"}})}}
>>> _ = (table / "_delta_log" / f"{3:020d}.json").write_text(json.dumps(info) + "\\n")
>>> [(v, [d["writer"] for d in docs]) for v, docs in commits(table)]
[(3, ['a'])]
>>> save_state(table, 3, {"scanned": 3}); saved_state(table)
{'scanned': 3}
>>> saved_state(table, until=2) is None
True
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: the key commit info and manifests carry lowtide's completeness under
META_KEY = "lowtide"
STATE_DIR = "_lowtide_state"
STATE_EVERY = 100  # versions between saved states
KEPT_STATES = 3


def _commit(log: Path, version: int) -> Path:
    return log / f"{version:020d}.json"


def _versions(log: Path, after: int) -> Iterator[int]:
    """The log's versions after ``after``: probed one by one from a known version (a
    tail), listed otherwise (the first read, or a gap left by the log's cleanup)."""
    if after >= 0 and _commit(log, after + 1).exists():
        v = after + 1
        while _commit(log, v).exists():
            yield v
            v += 1
        return
    yield from sorted(v for v in (int(p.stem) for p in log.glob("*.json") if p.stem.isdigit())
                      if v > after)


def commits(table: Path, after: int = -1,
            until: int | None = None) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """(version, lowtide's documents in its commit info) of every version after
    ``after`` up to ``until``, oldest first (versions of other writers: no documents).
    Commit files stay as JSON for the log's retention (30 days by default)."""
    log = table / "_delta_log"
    for v in _versions(log, after):
        if until is not None and v > until:
            return
        docs = []
        for line in _commit(log, v).read_text().splitlines():
            info = json.loads(line).get("commitInfo") if line.strip() else None
            meta = info.get("userMetadata") if info else None
            doc = _json_or_none(meta) if meta else None
            if isinstance(doc, dict) and META_KEY in doc:
                docs.append(doc[META_KEY])
        yield v, docs


def saved_state(table: Path, until: int | None = None) -> dict[str, Any] | None:
    """The newest saved state at or before version ``until``."""
    saved = sorted((int(p.stem), p) for p in (table / STATE_DIR).glob("*.json")
                   if p.stem.isdigit() and (until is None or int(p.stem) <= until))
    if not saved:
        return None
    state: dict[str, Any] = json.loads(saved[-1][1].read_text())
    return state


def save_state(table: Path, version: int, doc: dict[str, Any]) -> None:
    """Save the state replayed through ``version`` (atomically); keep the newest few."""
    folder = table / STATE_DIR
    folder.mkdir(exist_ok=True)
    tmp = folder / f".{version}.{uuid.uuid4().hex}"
    tmp.write_text(json.dumps(doc, sort_keys=True))
    os.replace(tmp, folder / f"{version:020d}.json")
    for old in sorted(folder.glob("*.json"))[:-KEPT_STATES]:
        old.unlink(missing_ok=True)


def _json_or_none(text: str) -> Any:
    """Other writers' user metadata need not be JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return None


__all__ = ["KEPT_STATES", "META_KEY", "STATE_DIR", "STATE_EVERY", "commits", "save_state",
           "saved_state"]
