"""The ingest log: one append-only, replayable log per front.

Layout of a log directory::

    front-00003.log   frames, appended, never rewritten (until truncated on recovery)
    front-00003.idx   one fixed-size entry per frame, written after the frame
    front-00003-00000000000000004096.log/.idx   the next file of the front's log,
                      named by its first offset (``rotate_bytes``)
    consumers/        what each consumer committed (:mod:`~lowtide.spark.sources.retention`)

A writer with ``rotate_bytes`` starts a new file once the current one holds that
many bytes; whole files below what every consumer committed are deleted
(:func:`lowtide.spark.sources.retention.retain`), so the log stays small.

A *frame* is what one :meth:`IngestWriter.append` call wrote: ``n`` records in columnar
form, so readers decode it with numpy, without a per-record Python loop::

    magic u32 | n u32 | first_offset u64 | payload_bytes u64 | crc32 u32 | pad u32
    times int64[n] | ends uint32[n] (end of each payload) | payload bytes

A record's *offset* is its index in the front's log (0, 1, 2, ...). It is also its
sequence number for deterministic acks: ``root_acks(front, offset)``. Record times are
slots, non-decreasing within a front, so the index doubles as a time -> offset index.

Readers trust only the index: a frame becomes visible when its index entry is complete,
so a reader never sees a torn frame. On open, a writer drops any frame past the last
index entry (and any torn index entry).

fsync policy: ``"always"`` (data, then index, on every append), ``"never"`` (leave it
to the OS; :meth:`IngestWriter.sync` on demand).

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> w = IngestWriter(d, front=3, fsync="never")
>>> w.append([b"a", b"bc"], time=10), w.append([b"d"], time=12), w.end_offset
(0, 2, 3)
>>> r = IngestReader(d, front=3)
>>> r.end_offset(), r.offset_of_time(11), r.offset_of_time(13)
(3, 2, 3)
>>> times, payloads = r.read(1, 3)
>>> times.tolist(), payloads.to_pylist()
([10, 12], [b'bc', b'd'])
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from lowtide.core.errors import LowtideError

MAGIC = 0x3146544C  # "LTF1" little endian
HEADER = np.dtype(
    [
        ("magic", "<u4"),
        ("n", "<u4"),
        ("first", "<u8"),
        ("payload_bytes", "<u8"),
        ("crc", "<u4"),
        ("pad", "<u4"),
    ]
)
INDEX = np.dtype(
    [
        ("first", "<u8"),
        ("n", "<u4"),
        ("pad", "<u4"),
        ("pos", "<u8"),
        ("first_time", "<i8"),
        ("last_time", "<i8"),
    ]
)
FSYNC_POLICIES = ("always", "never")
_NAME = re.compile(r"^front-(\d+)(?:-(\d{20}))?\.idx$")


def _stem(directory: str | os.PathLike[str], front: int, base: int) -> Path:
    return Path(directory) / (f"front-{front:05d}" + (f"-{base:020d}" if base else ""))


def log_path(directory: str | os.PathLike[str], front: int, base: int = 0) -> Path:
    """The file of ``front``'s log whose first offset is ``base``."""
    return _stem(directory, front, base).with_suffix(".log")


def index_path(directory: str | os.PathLike[str], front: int, base: int = 0) -> Path:
    return _stem(directory, front, base).with_suffix(".idx")


def _names(directory: str | os.PathLike[str]) -> list[tuple[int, int]]:
    d = Path(directory)
    if not d.is_dir():
        return []
    return [(int(m.group(1)), int(m.group(2) or 0))
            for p in d.iterdir() if (m := _NAME.match(p.name))]


def list_fronts(directory: str | os.PathLike[str]) -> list[int]:
    """Fronts that have a log in ``directory`` (sorted)."""
    return sorted({front for front, _base in _names(directory)})


def log_files(directory: str | os.PathLike[str], front: int) -> list[int]:
    """The first offsets of ``front``'s log files still present (sorted)."""
    return sorted(base for f, base in _names(directory) if f == front)


class LogCorrupt(LowtideError, RuntimeError):
    """A frame that the index points at does not match its header or checksum."""


class RecordsDeleted(LowtideError, IndexError):
    """Records asked for were deleted by retention (every registered consumer had
    committed them)."""


def _frame_size(n: int, payload_bytes: int) -> int:
    return HEADER.itemsize + 8 * n + 4 * n + payload_bytes


def _read_index(path: Path) -> npt.NDArray[np.void]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return np.empty(0, INDEX)
    whole = len(raw) // INDEX.itemsize
    return np.frombuffer(raw[: whole * INDEX.itemsize], INDEX)


class IngestWriter:
    """Appends frames to one front's log. Not thread-safe: one writer per front."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        front: int,
        *,
        fsync: str = "always",
        rotate_bytes: int | None = None,
        on_rotate: Callable[[], object] | None = None,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {FSYNC_POLICIES}, got {fsync!r}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.front = front
        self.fsync = fsync
        self.rotate_bytes = rotate_bytes
        self._on_rotate = on_rotate
        bases = log_files(directory, front) or [0]
        self._open_file(bases[-1])
        index = self._recover()
        if len(index):
            last = index[-1]
            self.end_offset = int(last["first"]) + int(last["n"])
            self.last_time = int(last["last_time"])
            self._pos = int(last["pos"]) + _frame_size(int(last["n"]), self._payload_of(last))
        else:  # a new log, or a crash right after a rotation
            previous = _read_index(index_path(directory, front, bases[-2])) if len(
                bases) > 1 else np.empty(0, INDEX)
            self.end_offset, self._pos = bases[-1], 0
            self.last_time = int(previous[-1]["last_time"]) if len(previous) else -1
        self._log = open(self._log_path, "ab")  # noqa: SIM115 (closed in close())
        self._idx = open(self._idx_path, "ab")  # noqa: SIM115

    def _open_file(self, base: int) -> None:
        self._base = base
        self._log_path = log_path(self.directory, self.front, base)
        self._idx_path = index_path(self.directory, self.front, base)

    def _rotate(self) -> None:
        """Close the current file; the next frame starts a file of its own."""
        self.close()
        self._open_file(self.end_offset)
        self._pos = 0
        self._log = open(self._log_path, "ab")  # noqa: SIM115
        self._idx = open(self._idx_path, "ab")  # noqa: SIM115
        if self._on_rotate is not None:
            self._on_rotate()

    def _payload_of(self, entry: np.void) -> int:
        with open(self._log_path, "rb") as f:
            f.seek(int(entry["pos"]))
            header = np.frombuffer(f.read(HEADER.itemsize), HEADER)[0]
        return int(header["payload_bytes"])

    def _recover(self) -> npt.NDArray[np.void]:
        """Drop torn index entries and frames past the last complete index entry."""
        index = _read_index(self._idx_path)
        size = self._log_path.stat().st_size if self._log_path.exists() else 0
        keep = len(index)
        while keep:
            entry = index[keep - 1]
            try:
                ok = _read_frame(self._log_path, entry, verify=True) is not None
            except LogCorrupt:
                ok = False
            if ok:
                break
            keep -= 1
        index = index[:keep]
        end = 0
        if keep:
            last = index[-1]
            end = int(last["pos"]) + _frame_size(int(last["n"]), self._payload_of(last))
        if self._idx_path.exists() and self._idx_path.stat().st_size != keep * INDEX.itemsize:
            os.truncate(self._idx_path, keep * INDEX.itemsize)
        if size != end and self._log_path.exists():
            os.truncate(self._log_path, end)
        return index

    def append(
        self, payloads: Sequence[bytes], time: int | Sequence[int] | npt.NDArray[np.int64]
    ) -> int:
        """Append records (one time for all, or one per record); returns the first
        record's offset. Times must not go below the previous record's."""
        n = len(payloads)
        if n == 0:
            return self.end_offset
        if self.rotate_bytes is not None and self._pos >= self.rotate_bytes:
            self._rotate()
        times = np.broadcast_to(np.asarray(time, np.int64), (n,)).astype("<i8")
        if int(times[0]) < self.last_time or bool((times[1:] < times[:-1]).any()):
            raise ValueError("record times must be non-decreasing within a front")
        ends = np.cumsum([len(p) for p in payloads], dtype=np.uint64)
        if n and int(ends[-1]) >= 1 << 32:
            raise ValueError("one append may carry at most 4 GiB of payload")
        body = times.tobytes() + ends.astype("<u4").tobytes() + b"".join(payloads)
        first = self.end_offset
        header = np.zeros(1, HEADER)
        header[0] = (MAGIC, n, first, int(ends[-1]), zlib.crc32(body), 0)
        self._log.write(header.tobytes() + body)
        self._log.flush()
        if self.fsync == "always":
            os.fsync(self._log.fileno())
        entry = np.zeros(1, INDEX)
        entry[0] = (first, n, 0, self._pos, int(times[0]), int(times[-1]))
        self._idx.write(entry.tobytes())
        self._idx.flush()
        if self.fsync == "always":
            os.fsync(self._idx.fileno())
        self._pos += HEADER.itemsize + len(body)
        self.end_offset = first + n
        self.last_time = int(times[-1])
        return first

    def sync(self) -> None:
        self._log.flush()
        self._idx.flush()
        os.fsync(self._log.fileno())
        os.fsync(self._idx.fileno())

    def close(self) -> None:
        if not self._log.closed:
            self.sync()
            self._log.close()
            self._idx.close()

    def __enter__(self) -> IngestWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_frame(
    path: Path, entry: np.void, *, verify: bool
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint32], bytes] | None:
    n = int(entry["n"])
    with open(path, "rb") as f:
        f.seek(int(entry["pos"]))
        raw_header = f.read(HEADER.itemsize)
        if len(raw_header) < HEADER.itemsize:
            return None
        header = np.frombuffer(raw_header, HEADER)[0]
        if (
            int(header["magic"]) != MAGIC
            or int(header["n"]) != n
            or int(header["first"]) != int(entry["first"])
        ):
            raise LogCorrupt(f"{path}: frame at {int(entry['pos'])} does not match its index")
        size = 12 * n + int(header["payload_bytes"])
        body = f.read(size)
    if len(body) < size:
        return None
    if verify and zlib.crc32(body) != int(header["crc"]):
        raise LogCorrupt(f"{path}: checksum mismatch in frame at {int(entry['pos'])}")
    times = np.frombuffer(body, "<i8", n, 0).astype(np.int64)
    ends = np.frombuffer(body, "<u4", n, 8 * n)
    return times, ends, body[12 * n :]


class IngestReader:
    """Reads one front's log by offset range, across its files; safe while a writer
    appends and while retention deletes files no consumer needs."""

    def __init__(self, directory: str | os.PathLike[str], front: int) -> None:
        self.directory = directory
        self.front = front

    def _entries(self) -> tuple[npt.NDArray[np.void], list[Path]]:
        """Every index entry of the front's files, and the log file of each."""
        parts, paths = [], []
        for base in log_files(self.directory, self.front):
            idx = _read_index(index_path(self.directory, self.front, base))
            parts.append(idx)
            paths += [log_path(self.directory, self.front, base)] * len(idx)
        return (np.concatenate(parts) if parts else np.empty(0, INDEX)), paths

    def index(self) -> npt.NDArray[np.void]:
        return self._entries()[0]

    def start_offset(self) -> int:
        """The first offset still stored (retention deletes whole files below it)."""
        idx = self.index()
        return int(idx[0]["first"]) if len(idx) else self.end_offset()

    def end_offset(self) -> int:
        """Offset one past the last visible record."""
        idx = self.index()
        if len(idx):
            return int(idx[-1]["first"]) + int(idx[-1]["n"])
        bases = log_files(self.directory, self.front)
        return bases[-1] if bases else 0

    def offset_of_time(self, time: int) -> int:
        """The first offset whose record time is >= ``time`` (end offset if none)."""
        idx, paths = self._entries()
        if len(idx) == 0:
            return self.end_offset()
        k = int(np.searchsorted(idx["last_time"], time, side="left"))
        if k == len(idx):
            return int(idx[-1]["first"]) + int(idx[-1]["n"])
        frame = _read_frame(paths[k], idx[k], verify=False)
        assert frame is not None
        times = frame[0]
        return int(idx[k]["first"]) + int(np.searchsorted(times, time, side="left"))

    def read(
        self, start: int, end: int, *, verify: bool = True
    ) -> tuple[npt.NDArray[np.int64], Any]:
        """Records [start, end): (times int64 array, pyarrow BinaryArray of payloads)."""
        import pyarrow as pa

        idx, paths = self._entries()
        first = int(idx[0]["first"]) if len(idx) else self.end_offset()
        visible = int(idx[-1]["first"]) + int(idx[-1]["n"]) if len(idx) else first
        if start < first and start < end:
            raise RecordsDeleted(
                f"front {self.front}: records [{start}, {first}) were deleted by retention "
                "(every registered consumer had committed them); register a consumer "
                "before its first read (retention.register_consumer)")
        if not 0 <= start <= end <= visible:
            raise IndexError(f"range [{start}, {end}) outside the visible log [0, {visible})")
        if start == end:
            return np.empty(0, np.int64), pa.array([], pa.binary())
        firsts = idx["first"].astype(np.int64)
        k = int(np.searchsorted(firsts, start, side="right")) - 1
        times_parts: list[npt.NDArray[np.int64]] = []
        arrays = []
        while k < len(idx) and int(idx[k]["first"]) < end:
            entry = idx[k]
            frame = _read_frame(paths[k], entry, verify=verify)
            if frame is None:
                raise LogCorrupt(f"{paths[k]}: indexed frame {k} is incomplete")
            times, ends, payload = frame
            n = int(entry["n"])
            offsets = np.concatenate(([0], ends)).astype(np.int32)
            arr = pa.BinaryArray.from_buffers(
                pa.binary(), n, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(payload)]
            )
            lo = max(start - int(entry["first"]), 0)
            hi = min(end - int(entry["first"]), n)
            times_parts.append(times[lo:hi])
            arrays.append(arr.slice(lo, hi - lo))
            k += 1
        return np.concatenate(times_parts), pa.concat_arrays(arrays)
