"""Read what a tracked table published: "complete through t", without the tracker and
without Spark (a batch job, another team, a shell).

>>> import tempfile
>>> folder = tempfile.mkdtemp()
>>> complete_below(folder) is None
True
>>> _ = open(f"{folder}/_lowtide_manifest.json", "w").write(
...     '{"lowtide": {"complete_below": 7, "complete_below_ms": 70, "wall_ms": 5, '
...     '"graph": "ab", "segment": "sink", "batch": 3}}')
>>> c = complete_below(folder); c.complete_below, c.batch, c.version
(7, 3, None)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowtide.spark.sinks.tables import MANIFEST, META_KEY


@dataclass(frozen=True)
class Completeness:
    """Every row with ``lt_time < complete_below`` (a slot; ``complete_below_ms`` in
    wall-clock ms) is in the table: at Delta version ``version``, or in the Parquet
    folder's files."""

    complete_below: int
    complete_below_ms: int
    wall_ms: int  # when the sink published it
    graph: str  # fingerprint of the pipeline graph the tracker tracked
    segment: str  # the sink's segment
    batch: int  # the sink's micro-batch that published it
    version: int | None = None  # Delta: the table version carrying it

    @classmethod
    def of(cls, doc: dict[str, Any], version: int | None = None) -> Completeness:
        return cls(int(doc["complete_below"]), int(doc["complete_below_ms"]),
                   int(doc["wall_ms"]), str(doc["graph"]), str(doc["segment"]),
                   int(doc["batch"]), version)


def complete_below(path: str | Path, version: int | None = None) -> Completeness | None:
    """What the tracked table at ``path`` published last (Delta: at or before
    ``version``), or None if it published nothing yet."""
    folder = Path(path)
    log = folder / "_delta_log"
    if log.is_dir():
        return _from_delta_log(log, version)
    manifest = folder / MANIFEST
    if manifest.exists():
        return Completeness.of(json.loads(manifest.read_text())[META_KEY])
    return None


def _from_delta_log(log: Path, version: int | None) -> Completeness | None:
    """The newest commit (at or before ``version``) whose commit info carries lowtide's
    user metadata. Commit files stay as JSON for the log's retention (30 days by
    default), and every batch of a tracked sink writes one."""
    commits = sorted((int(p.stem), p) for p in log.glob("*.json") if p.stem.isdigit())
    for v, path in reversed(commits):
        if version is not None and v > version:
            continue
        for line in path.read_text().splitlines():
            info = json.loads(line).get("commitInfo") if line.strip() else None
            meta = info.get("userMetadata") if info else None
            doc = _json_or_none(meta) if meta else None
            if isinstance(doc, dict) and META_KEY in doc:
                return Completeness.of(doc[META_KEY], v)
    return None


def _json_or_none(text: str) -> Any:
    """Other writers' user metadata need not be JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return None


__all__ = ["Completeness", "complete_below"]
