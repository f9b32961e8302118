"""Consumers that join a running front, through the log directory.

A query that reads an ingest log asks to be fed (:func:`request_join`, before its first
read): ``<log dir>/joins/<segment>.json`` names its ingest segment and its consumer. A
running :class:`lowtide.Front` finds the request between batches, registers on that
segment and answers once, in ``<log dir>/joins/<segment>/f<front>.json``: the first
offset whose send-acks it sends into the segment, the first time (every record from that
offset on is labelled at or after it; for a joined consumer, every earlier one before
it) and the front id it registered there. The answer is written once and never moves, so
every attempt of a batch reads the same records (rule 5): the consumer reads a front
from its answer's offset (:func:`start_offsets`): exactly the records the front acked
into its segment. A front answers for every segment it sends into, so a front that
answered for some segment and not for a consumer's has not joined it yet: the consumer
waits for it. A log whose front never answered anything (written by an older producer or
by hand) is read from its start, as before.

A Kafka topic has no per-front offsets a reader could cut at: its producers' fronts and
its queries share a directory (``joins_dir=``) and the same files, and the reader keeps
each front's records (header ``lt_front``) labelled at or after its answer's time
(:func:`start_times`): the front labels every record it sends into the segment at or
above that time, and every earlier one below it.

:func:`release_join` (a detached consumer, rule 16) removes the request and the answers:
the fronts stop sending into its segment.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> record_join(d, "ingest", front=0, join=Join(offset=0, time=-1, front_id=0))
>>> request_join(d, "late", consumer="late")
>>> start_offsets(d, "late", [0, 1])     # front 0 answers elsewhere, not yet here
{0: None, 1: 0}
>>> record_join(d, "late", front=0, join=Join(offset=42, time=900, front_id=1 << 32))
>>> start_offsets(d, "late", [0, 1]), join_requests(d)
({0: 42, 1: 0}, {'late': 'late'})
>>> start_times(d, "late", [0, 1])      # a shared topic's reader keeps lt_time >= these
{0: 900, 1: -1}
>>> release_join(d, "late"); start_offsets(d, "late", [0])
{0: None}
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "Answers",
    "Join",
    "answers_of",
    "join_requests",
    "read_answers",
    "record_join",
    "release_join",
    "request_join",
    "start_offsets",
    "start_times",
]

JOINS = "joins"


@dataclass(frozen=True)
class Join:
    """A front's answer to a consumer: it sends the send-acks of its records from
    ``offset`` on (labelled at ``time`` or later) into the consumer's segment, as
    front ``front_id``."""

    offset: int
    time: int
    front_id: int


def _folder(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / JOINS


def _checked(name: str) -> str:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"segment or consumer name {name!r}: use letters, digits, - and _")
    return name


def _write_once(path: Path, doc: dict[str, object]) -> bool:
    """Write ``doc`` whole (temporary file, then a link that fails if ``path`` exists):
    the first writer wins and the file never changes after."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(doc))
    try:
        os.link(temporary, path)
        return True
    except FileExistsError:
        return False
    finally:
        temporary.unlink(missing_ok=True)


def request_join(directory: str | os.PathLike[str], segment: str, *, consumer: str) -> None:
    """``consumer`` reads the log into ``segment``: every front is asked to feed it."""
    _write_once(_folder(directory) / f"{_checked(segment)}.json", {"consumer": consumer})


def join_requests(directory: str | os.PathLike[str]) -> dict[str, str]:
    """``{segment: consumer}`` of every consumer that asked to be fed."""
    out = {}
    for path in sorted(_folder(directory).glob("*.json")):
        try:
            out[path.stem] = str(json.loads(path.read_text())["consumer"])
        except FileNotFoundError:  # released meanwhile
            continue
    return out


def record_join(directory: str | os.PathLike[str], segment: str, *, front: int,
                join: Join) -> None:
    """``front``'s answer to ``segment``'s consumer (an earlier answer stays)."""
    _write_once(_folder(directory) / _checked(segment) / f"f{front}.json", asdict(join))


def answers_of(directory: str | os.PathLike[str], front: int) -> dict[str, Join]:
    """``{segment: answer}`` of every segment ``front`` answered for."""
    out = {}
    for path in sorted(_folder(directory).glob(f"*/f{front}.json")):
        try:
            out[path.parent.name] = Join(**json.loads(path.read_text()))
        except FileNotFoundError:
            continue
    return out


@dataclass(frozen=True)
class Answers:
    """Every answer of a joins directory, read at one moment (one scan: an answer never
    changes once written, so a reader may keep them for as long as it reads records
    written before the scan)."""

    by_segment: dict[str, dict[int, Join]]

    def start(self, segment: str, front: int, field: str, never_answered: int) -> int | None:
        """``front``'s answer's ``field`` for ``segment`` (None: it answered another
        segment only, it has not joined this one yet; ``never_answered``: it answered
        none)."""
        mine = self.by_segment.get(segment, {})
        if front in mine:
            return int(getattr(mine[front], field))
        answered = any(front in others for others in self.by_segment.values())
        return None if answered else never_answered

    def start_time(self, segment: str, front: int) -> int | None:
        """:func:`start_times` of one front."""
        return self.start(segment, front, "time", -1)


def read_answers(directory: str | os.PathLike[str]) -> Answers:
    """The answers in ``directory`` now (see :class:`Answers`)."""
    out: dict[str, dict[int, Join]] = {}
    for path in _folder(directory).glob("*/f*.json"):
        try:
            join = Join(**json.loads(path.read_text()))
        except FileNotFoundError:  # released meanwhile
            continue
        out.setdefault(path.parent.name, {})[int(path.stem[1:])] = join
    return Answers(out)


def _starts(directory: str | os.PathLike[str], segment: str, fronts: list[int],
            field: str, never_answered: int) -> dict[int, int | None]:
    answers = read_answers(directory)
    return {front: answers.start(segment, front, field, never_answered) for front in fronts}


def start_offsets(directory: str | os.PathLike[str], segment: str,
                  fronts: list[int]) -> dict[int, int | None]:
    """Per front, the first offset ``segment``'s consumer reads (None: the front feeds
    other consumers and has not joined this one yet: wait)."""
    return _starts(directory, segment, fronts, "offset", 0)


def start_times(directory: str | os.PathLike[str], segment: str,
                fronts: list[int]) -> dict[int, int | None]:
    """Per front, the first label time ``segment``'s consumer reads (a reader of a
    shared topic keeps the front's records at or after it; None: the front has not
    joined this consumer yet, none of its records so far are for it; -1: a front that
    never answered anything, all of its records are)."""
    return _starts(directory, segment, fronts, "time", -1)


def release_join(directory: str | os.PathLike[str], segment: str) -> None:
    """``segment``'s consumer reads no more: no front feeds it from now on."""
    (_folder(directory) / f"{_checked(segment)}.json").unlink(missing_ok=True)
    shutil.rmtree(_folder(directory) / segment, ignore_errors=True)
