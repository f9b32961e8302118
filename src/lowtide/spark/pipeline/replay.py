"""Replay by time (Gearpump's timestamp-based replay from a source-side store: the
ingest log, whose index maps times to offsets, or a Kafka topic, whose broker's
timestamp index does).

* :func:`replay` re-runs a query's steps over the records of a time range
  ``[from, to)`` (:mod:`lowtide.spark.sources.log_replay`: one offset range per front;
  :mod:`lowtide.spark.sources.kafka_replay`: per partition, from the offset of
  ``from``) into a fresh output, on a tracker of its own, and returns once that output
  is complete below ``to``: a backfill, or a recomputation to compare with.
* :func:`losses` turns the tracker's stuck windows into what to replay: per window, its
  segment, slots, missing count and the offsets of every front of the log in its time
  range (a stateless step keeps its rows' times, so the lost rows came from there).

Completing the stuck windows with a replay is :mod:`.repair`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from lowtide.core.errors import LowtideError
from lowtide.core.time import TimeGrid
from lowtide.spark.pipeline.query import slot_after, span, timestamp_of
from lowtide.spark.pipeline.sources import SourceSpec
from lowtide.spark.pipeline.stream import Stream
from lowtide.spark.sources.kafka_replay import (
    REPLAY_FRONT,
    REPLAY_OWNER,
    KafkaReplayRefused,
    kafka_options,
    kafka_range,
    range_acks,
    reading,
)
from lowtide.spark.sources.log_replay import RANGE_OPTION, replay_offsets

if TYPE_CHECKING:
    from lowtide.spark.pipeline.builder import Pipeline

__all__ = ["Loss", "ReplayRefused", "Replayed", "log_source_of", "losses", "losses_of", "replay",
           "replay_slots"]


T = TypeVar("T")


class ReplayRefused(LowtideError, ValueError):
    """A replay or repair that would not be exact (one line: why, and what to do)."""


@dataclass(frozen=True)
class Loss:
    """A stuck window with missing items, and where its rows entered: per front of the
    log, the offsets ``[start, end)`` of its records in the window's time range (per
    partition of a Kafka topic: offsets that hold them, and maybe others)."""

    segment: str
    start: int  # slots [start, end)
    end: int
    missing: int
    offsets: dict[int, tuple[int, int]]
    since_ms: int = 0  # when the tracker first saw it open with its bound passed
    source: str = "front"  # what ``offsets`` is keyed by: "front" (log), "partition" (Kafka)

    def describe(self, grid: TimeGrid) -> str:
        where = ", ".join(f"{self.source} {f} offsets [{lo}, {hi})"
                          for f, (lo, hi) in sorted(self.offsets.items()) if hi > lo)
        return (f"segment {self.segment!r}, {span(self.start, self.end, grid)}: "
                f"{self.missing} item(s) missing; replay {where or 'no record (none logged)'}")


@dataclass(frozen=True)
class Replayed:
    """A replay: the output it wrote, complete below ``to_slot``."""

    path: str
    from_slot: int
    to_slot: int
    offsets: dict[int, tuple[int, int]]


def _sources(stream: Stream) -> list[SourceSpec]:
    sources: list[SourceSpec] = []

    def walk(s: Stream) -> None:
        if s.source is not None and all(s.source is not o for o in sources):
            sources.append(s.source)
        for i in s.inputs:
            walk(i)

    walk(stream)
    return sources


def log_source_of(stream: Stream) -> SourceSpec:
    """The one ingest log ``stream`` reads (a one-line refusal otherwise)."""
    sources = _sources(stream)
    if len(sources) != 1 or sources[0].kind != "log":
        kinds = ", ".join(s.kind for s in sources)
        raise ReplayRefused(f"replay by time reads one ingest log (pipe.read_log) or one "
                            f"Kafka topic (pipe.read_stream); this query reads {kinds}")
    return sources[0]


def replay_source_of(stream: Stream) -> tuple[SourceSpec, dict[str, str] | None]:
    """The one source ``stream`` replays from, and its Kafka options if it is a
    labelled Kafka stream (None: an ingest log)."""
    try:
        return log_source_of(stream), None
    except ReplayRefused:
        frames = [s for s in _sources(stream) if s.kind == "frame"]
        options = kafka_options(frames[0].frame) if len(frames) == 1 else None
        if options is None or len(_sources(stream)) != 1:
            raise
        return frames[0], options


def _fronts(src: SourceSpec) -> list[int] | None:
    from lowtide.spark.sources.log_source import parse_fronts

    return parse_fronts(src.options.get("fronts"))


def _missing(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in status.get("stuck_detail", []) if int(w.get("missing", 0)) > 0]


def _loss(w: dict[str, Any], offsets: dict[int, tuple[int, int]], source: str) -> Loss:
    return Loss(w["segment"], int(w["window_start"]), int(w["window_end"]), int(w["missing"]),
                offsets, int(w.get("since_ms", 0)), source)


def losses(status: dict[str, Any], log_dir: str, fronts: list[int] | None = None) -> list[Loss]:
    """The stuck windows with missing items in a tracker's ``status``, each with the
    offsets of the log's records in its time range."""
    return [_loss(w, replay_offsets(log_dir, fronts, int(w["window_start"]),
                                    int(w["window_end"])), "front")
            for w in _missing(status)]


def losses_of(status: dict[str, Any], stream: Stream) -> list[Loss]:
    """:func:`losses` in the ingest log or the Kafka topic ``stream`` reads (a topic:
    per partition, the offsets that hold the window's records)."""
    src, kafka = replay_source_of(stream)
    if kafka is None:
        return losses(status, src.options["path"], _fronts(src))
    delta_ms = stream.pipeline.grid.delta_ms

    def held(w: dict[str, Any]) -> dict[int, tuple[int, int]]:
        lo, hi = int(w["window_start"]), int(w["window_end"])
        return _refused(lambda: kafka_range(kafka, lo, hi, delta_ms)).offsets

    return [_loss(w, held(w), "partition") for w in _missing(status)]


def _refused(call: Callable[[], T]) -> T:
    """``call()``, a Kafka refusal raised as :class:`ReplayRefused`."""
    try:
        return call()
    except KafkaReplayRefused as exc:
        raise ReplayRefused(str(exc)) from None


def _rebound(stream: Stream, pipe: Pipeline, ranged: SourceSpec) -> Stream:
    """``stream`` described on ``pipe``, its source ``ranged`` (reading the range)."""
    memo: dict[int, SourceSpec] = {}

    def rebind(s: Stream) -> Stream:
        src = s.source
        if src is not None:
            if id(src) not in memo:
                memo[id(src)] = ranged
                pipe._sources.append(memo[id(src)])
            src = memo[id(src)]
        return replace(s, pipeline=pipe, source=src, inputs=tuple(map(rebind, s.inputs)))

    return rebind(stream)


def _slots(pipe: Pipeline, from_time: datetime | int, to_time: datetime | int) -> tuple[int, int]:
    lo, hi = slot_after(from_time, pipe.grid), slot_after(to_time, pipe.grid)
    if hi <= lo:
        raise ReplayRefused(f"replay from {from_time} to {to_time}: the range is empty")
    return lo, hi


def _check_promised(pipe: Pipeline, src: SourceSpec, to_slot: int) -> None:
    """Every record below ``to_slot`` must be in the log already: the fronts of its
    ingest segment promised it on the pipeline's tracker."""
    segment = src.name or "ingest"
    rows = [s for s in pipe.tracker.status()["segments"] if s["segment"] == segment]
    bound = int(rows[0]["bound"]) if rows else -1
    if bound < to_slot:
        raise ReplayRefused(
            f"the fronts of {segment!r} promised only up to {timestamp_of(bound, pipe.grid)}: "
            "records before the replay's end may still come; replay up to there")


def replay(pipe: Pipeline, stream: Stream, from_time: datetime | int,
           to_time: datetime | int, path: str, *, sink: str = "sink",
           timeout_s: float = 300.0) -> Replayed:
    """Re-run ``stream`` over its source's records of ``[from_time, to_time)`` (datetimes
    or epoch ms, rounded up to slots) into Parquet files at ``path`` (a fresh folder;
    labels kept), tracked on a tracker of its own; returns once ``path`` is complete
    below ``to_time``."""
    lo, hi = _slots(pipe, from_time, to_time)
    return replay_slots(pipe, stream, lo, hi, path, sink, timeout_s)


def replay_slots(pipe: Pipeline, stream: Stream, lo: int, hi: int, path: str, sink: str,
                 timeout_s: float) -> Replayed:
    """:func:`replay` of the slots ``[lo, hi)``."""
    src, kafka = replay_source_of(stream)
    _check_promised(pipe, src, hi)
    out = Path(path)
    if out.exists() and any(out.iterdir()):
        raise ReplayRefused(f"a replay writes a fresh output: {path} is not empty")
    rp = type(pipe)(pipe.spark, f"{pipe.name}-replay", grid=pipe.grid,
                    stuck_after_ms=int(timeout_s * 1000), progress_metrics=False)
    checkpoint = tempfile.mkdtemp(prefix="lowtide-replay-")
    try:
        if kafka is None:
            offsets = replay_offsets(src.options["path"], _fronts(src), lo, hi)
            ranged = replace(src, options={**src.options, RANGE_OPTION: f"{lo}:{hi}"},
                             fronts=None)
            rebound = _rebound(stream, rp, ranged)
        else:
            offsets, rebound = _kafka_rebound(stream, rp, src, kafka, lo, hi, sink)
        query = rebound.write_parquet(
            str(out), checkpoint=checkpoint, name=sink, keep_tracking_columns=True,
            trigger="200 milliseconds", query_name=None)
        query.wait_for_min_time(hi, timeout_s=timeout_s)
    finally:
        rp.close()
        shutil.rmtree(checkpoint, ignore_errors=True)
    return Replayed(str(out), lo, hi, offsets)


def _kafka_rebound(stream: Stream, rp: Pipeline, src: SourceSpec, options: dict[str, str],
                   lo: int, hi: int, sink: str) -> tuple[dict[int, tuple[int, int]], Stream]:
    """The Kafka range of ``[lo, hi)`` (offsets per partition), and ``stream`` on
    ``rp`` reading it; ``rp``'s tracker started with the range's records sent into
    its ingest segment by the driver, their front promising ``hi``."""
    rng = _refused(lambda: kafka_range(options, lo, hi, rp.grid.delta_ms))
    ranged = replace(src, frame=reading(src.frame, rng, src.options["time_col"]), fronts=None)
    rebound = _rebound(stream, rp, ranged)
    handle = rp.start_tracker(rebound.graph(sink))
    segment = src.name or "ingest"
    acks = _refused(lambda: range_acks(rp.spark, options, rng, rp.grid.delta_ms,
                                       handle.graph.index(segment)))
    agent = handle.agent
    agent.register_front(REPLAY_FRONT, segment, lo, owner=REPLAY_OWNER)
    agent.add_acks(acks)
    agent.heartbeat(REPLAY_FRONT, hi, owner=REPLAY_OWNER)  # after its records' acks
    agent.flush()
    return rng.offsets, rebound
