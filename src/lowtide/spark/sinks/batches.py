"""A file sink's batches: which run wrote which files, and which rows they hold (rule 14:
an output of one run never replaces, shadows or stands in for another run's).

A batch's files are named after the query's id (``part-<query>-<batch>[-<part>].parquet``):
Spark keeps the id in the checkpoint, so a restart from the checkpoint has it and a
rerun from a new checkpoint has another, whose batch ids start at 0 again next to the
earlier run's files. A batch whose files are all in place is recorded in
``_lowtide_commits/<query>.json`` with the digest of its rows' labels (per slot: the XOR
of the acks and the count). A batch re-run after a restart finds its record:

* the same digest: its files hold exactly these rows, nothing is written again;
* another digest: the batch re-ran with other rows (a non-deterministic source or
  step): :class:`BatchRewritten`, nothing is replaced (fail closed); so is a batch older
  than the record keeps (:data:`KEPT_BATCHES`), which Spark never re-runs;
* no record, but files of the batch: leftovers of a commit that did not finish (never
  acked, never announced), replaced.

>>> import tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> files = BatchFiles(folder, "q1", 0)
>>> d = digest([5], [3], [2])
>>> files.committed(d)
False
>>> _ = (folder / "staged").write_text("rows")
>>> files.publish([(folder / "staged", "00000")], d)
>>> sorted(p.name for p in folder.glob("part-*"))
['part-q1-0000000000-00000.parquet']
>>> files.committed(d)
True
>>> BatchFiles(folder, "q2", 0).committed(d)  # a rerun from a new checkpoint: its own
False
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

COMMITS = "_lowtide_commits"  # leading "_": Spark's file source skips it
KEPT_BATCHES = 100


class BatchRewritten(RuntimeError):
    """A batch re-ran with other rows than the ones its earlier run committed."""

    @classmethod
    def of(cls, query: str, batch: int, where: object) -> BatchRewritten:
        return cls(f"batch {batch} of query {query} re-ran with other rows than the ones "
                   f"it committed to {where} (a non-deterministic source or step), which "
                   "are kept: rerun with the input that batch read, or write elsewhere "
                   "from a new checkpoint")


def digest(times: npt.ArrayLike, xors: npt.ArrayLike, counts: npt.ArrayLike) -> str:
    """The rows of a batch, by their labels: per slot the XOR of the acks and the
    count, in slot order (the same rows give the same digest in any order)."""
    t = np.asarray(times, np.int64)
    order = np.argsort(t, kind="stable")
    h = hashlib.sha256()
    for column, kind in ((t, np.int64), (xors, np.uint64), (counts, np.int64)):
        h.update(np.ascontiguousarray(np.asarray(column, kind)[order]).tobytes())
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class BatchFiles:
    """Batch ``batch`` of query ``query`` in ``folder``: its names and its record."""

    folder: Path
    query: str
    batch: int

    def name(self, part: str = "") -> str:
        tail = f"-{part}" if part else ""
        return f"part-{self.query}-{self.batch:010d}{tail}.parquet"

    @property
    def record(self) -> Path:
        """The query's record: its latest :data:`KEPT_BATCHES` batches (Spark re-runs
        only the last one after a restart), one file per query, not per batch."""
        return self.folder / COMMITS / f"{self.query}.json"

    def _recorded(self) -> dict[str, dict[str, Any]]:
        if not self.record.exists():
            return {}
        batches: dict[str, dict[str, Any]] = json.loads(self.record.read_text())["batches"]
        return batches

    def committed(self, rows_digest: str) -> bool:
        """True if this batch's files are in place and hold rows of this digest; False
        if it was not committed (leftover files of an unfinished commit are removed);
        :class:`BatchRewritten` if it was, with other rows, or is too old to tell."""
        recorded = self._recorded()
        earlier = recorded.get(str(self.batch))
        if earlier is not None and earlier["digest"] == rows_digest:
            return True
        too_old = earlier is None and recorded and self.batch < min(map(int, recorded))
        if earlier is not None or too_old:
            raise BatchRewritten.of(self.query, self.batch, self.folder)
        for leftover in self.folder.glob(self.name("*")):
            leftover.unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.folder / self.name()).unlink()
        return False

    def publish(self, staged: Sequence[tuple[Path, str]], rows_digest: str) -> None:
        """Rename each staged file to this batch's name for its part (local, POSIX
        folders: atomic), then record the batch (atomically) with the digest."""
        names = []
        for path, part in staged:
            os.replace(path, self.folder / self.name(part))
            names.append(self.name(part))
        recorded = self._recorded()
        recorded[str(self.batch)] = {"digest": rows_digest, "files": names}
        kept = sorted(recorded, key=int)[-KEPT_BATCHES:]
        self.record.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.record.parent / f".{self.record.name}.{uuid.uuid4().hex}"
        tmp.write_text(json.dumps({"query": self.query,
                                   "batches": {b: recorded[b] for b in kept}}))
        os.replace(tmp, self.record)


__all__ = ["COMMITS", "KEPT_BATCHES", "BatchFiles", "BatchRewritten", "digest"]
