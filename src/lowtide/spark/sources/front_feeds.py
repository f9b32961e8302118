"""The consumer segments one :class:`lowtide.Front` sends into, and how a running front
joins a consumer attached to its log (and leaves a detached one) without a restart.

Each record is one copy per consumer segment (rule 11), acked into each; the front is
registered there as ``front + k * CONSUMER_STRIDE`` for its k-th consumer. A front with
an ingest log follows the log directory's join requests
(:mod:`~lowtide.spark.sources.joins`) between batches: for a consumer that asked, it
takes the tracker's current graph generation (the consumer's segment was attached
there, rule 16), registers on the segment at a time ``t`` above every label it gave so
far (and at or above the segment's min time), answers ``(next offset, t, front id)``
once and only then labels on, each later record labelled at or above ``t`` acked into
the new segment too. The consumer reads the front from that offset (a log) or its
records labelled at or above ``t`` (a topic, ``joins_dir``): the front's acks and the
consumer's reads are the same records (rule 5). A consumer whose answer was removed
(released) is left: the front unregisters there and sends it nothing more.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Any

from lowtide.core.errors import (
    FrontBehind,
    FrontHeld,
    FrontOwned,
    LowtideError,
    NonMonotonicHeartbeat,
    ProtocolError,
)
from lowtide.core.time import TimeGrid
from lowtide.spark.sources.front_agent import FrontAgent
from lowtide.spark.sources.front_owner import register_when_free
from lowtide.spark.sources.joins import Join, answers_of, join_requests, record_join
from lowtide.spark.tracking.key_ranges import front_cell

log = logging.getLogger("lowtide.spark.front")

#: Front ids of one front's registrations on its 2nd, 3rd, ... consumer segment.
CONSUMER_STRIDE = 1 << 32
#: registers of a clock front at its segments' min time, each from the min time then
FLOOR_ATTEMPTS = 20


class FrontEnded(LowtideError, RuntimeError):
    """A producer resumes a front whose input ended (closed with ``close()``)."""


class JoinRefused(LowtideError, RuntimeError):
    """The tracker refused a front's registration on a consumer's segment: the front
    did not join it (no answer, nothing labelled or acked into it)."""


@dataclass
class Feed:
    """One consumer segment the front sends into, as front ``front_id``; heartbeats
    into it never go below ``floor`` (where it joined)."""

    segment: str
    front_id: int
    cell: int  # what its send-acks carry: the segment, or its key range
    floor: int = -1


class Feeds:
    """The consumer segments of front ``front``; with a joins directory (its ingest
    log's, or a ``joins_dir`` it shares with the queries of a topic) it also follows
    joins."""

    def __init__(self, front: int, agent: FrontAgent, graph: Any, segments: tuple[str, ...],
                 joins_dir: str | os.PathLike[str] | None) -> None:
        self.front, self._agent, self._joins_dir = front, agent, joins_dir
        self.items = [Feed(s, fid, front_cell(graph, s, fid))
                      for k, s in enumerate(segments)
                      for fid in [front + k * CONSUMER_STRIDE]]

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(f.segment for f in self.items)

    @property
    def follows(self) -> bool:
        """Whether the front follows joins (it has a joins directory)."""
        return self._joins_dir is not None

    @property
    def front_ids(self) -> list[int]:
        return [f.front_id for f in self.items]

    def register(self, slot: int, owner: str, grid: TimeGrid, *, clock: bool = False) -> int:
        """Register (or, as the successor of a previous run, resume) the front at
        ``slot`` on every segment; returns where it registered: a successor whose
        front already promised more resumes there. A ``clock`` front (its labels are
        its clock, never below its last heartbeat) refused as behind starts at the
        segments' min time instead: it labelled nothing below it, and other fronts'
        heartbeats may pass its clock reading while it starts (a busy machine)."""
        try:
            self._register_all(slot, owner)
        except FrontBehind:
            if not clock:
                raise
            slot = self._register_at_floor(slot, owner)
        except NonMonotonicHeartbeat:
            promised = self._promised()
            if grid.at_end(promised):
                raise FrontEnded(
                    f"front {self.front} ended: its producer closed it with close(), the "
                    "end of its input. A producer that will resume its front closes it "
                    "with close(end=False); a new input needs a new front id") from None
            slot = self._register_all(max(slot, promised), owner)
        except FrontHeld as exc:
            raise FrontHeld(f"front {self.front}: a live producer with the same owner "
                            f"{owner!r} holds it ({exc})") from None
        except FrontOwned:
            raise FrontOwned(
                f"front {self.front} belongs to another producer (this one is owner "
                f"{owner!r}): two producers configured with one front id? Give each "
                "its own front id; a restarted producer must name its predecessor's "
                "owner=") from None
        return slot

    def _register_all(self, slot: int, owner: str) -> int:
        """Register the front at ``slot`` on every segment (again where it did
        register: a heartbeat, rule 3); returns ``slot``."""
        for feed in self.items:
            register_when_free(self._agent, feed.front_id, feed.segment, slot, owner)
        return slot

    def _register_at_floor(self, slot: int, owner: str) -> int:
        """Register a clock front at its segments' min time (or ``slot``, if later);
        returns where. Other fronts' heartbeats may pass that min time again before the
        register arrives (a front beating every few ms): then from the new min time, up
        to :data:`FLOOR_ATTEMPTS` times."""
        for _ in range(FLOOR_ATTEMPTS - 1):
            with contextlib.suppress(FrontBehind):
                return self._register_all(max(slot, self._floor(*self.segments)), owner)
        return self._register_all(max(slot, self._floor(*self.segments)), owner)

    def _promised(self) -> int:
        """What the tracker holds as this front's heartbeat (a successor resumes there)."""
        fronts = self._agent.status().get("fronts", {})
        times = [int(fronts[str(f)][1]) for f in self.front_ids if str(f) in fronts]
        return max(times, default=-1)

    def answer_given(self, next_seq: int, time: int) -> None:
        """A log front answers for the segments it was given (so a consumer of another
        one waits for it to join) and resumes the ones it joined in an earlier run.
        A given segment it never answered for: from the log's start if the front
        answered for none (a new log, or one written before joins existed), else from
        ``next_seq`` (added at a restart: earlier records were never acked there)."""
        if self._joins_dir is None:
            return
        answered = answers_of(self._joins_dir, self.front)
        first = Join(0, -1, 0) if not answered else Join(next_seq, time, 0)
        for feed in self.items:
            if feed.segment not in answered:
                record_join(self._joins_dir, feed.segment, front=self.front,
                            join=Join(first.offset, first.time, feed.front_id))
            # only records at or above its answer's time go into it (a topic's reader
            # keeps those of this front)
            feed.floor = answered[feed.segment].time if feed.segment in answered else first.time
        requested = join_requests(self._joins_dir)
        graph = self._graph_with(*[s for s in answered if s in requested])
        for segment, join in answered.items():
            if segment in requested and segment not in self.segments and graph is not None:
                self.items.append(Feed(segment, join.front_id,
                                       front_cell(graph, segment, join.front_id), join.time))

    def follow(self, next_seq: int, time: int, owner: str) -> int | None:
        """Leave released consumers, join requested ones at ``time`` or later (at
        offset ``next_seq``); returns the time of the latest join (labels go on at or
        above it), None if none."""
        if self._joins_dir is None:
            return None
        answered = answers_of(self._joins_dir, self.front)
        for feed in [f for f in self.items if f.segment not in answered]:
            self._leave(feed, owner)
        joined = None
        for segment in join_requests(self._joins_dir):
            if segment not in self.segments:
                joined = self._join(segment, next_seq, max(time, joined or -1), owner) or joined
        return joined

    def _join(self, segment: str, next_seq: int, time: int, owner: str) -> int | None:
        graph = self._graph_with(segment)
        if graph is None:  # not attached on the tracker yet: ask again later
            return None
        k = max([(f - self.front) // CONSUMER_STRIDE for f in self.front_ids], default=-1)
        fid = self.front + (k + 1) * CONSUMER_STRIDE
        try:
            time = self._register(fid, segment, time, owner)
        except ProtocolError as exc:  # e.g. detached since this agent's graph generation
            self._agent.follow_graph()  # the next follow sees the tracker's current one
            raise JoinRefused(
                f"front {self.front} did not join consumer {segment!r}: the tracker "
                f"refused its registration ({exc}); it sends nothing there and asks "
                "again while the query's join request stands (pipe.detach removes it)") from None
        record_join(self._joins_dir, segment, front=self.front,  # type: ignore[arg-type]
                    join=Join(next_seq, time, fid))
        self.items.append(Feed(segment, fid, front_cell(graph, segment, fid), time))
        log.info("front joined a consumer", extra={"front": self.front, "segment": segment,
                                                   "offset": next_seq, "time": time})
        return time

    def _register(self, fid: int, segment: str, time: int, owner: str) -> int:
        """Register ``fid`` at ``time``, or where the tracker says it must start: the
        segment's min time, or where a previous run of this front promised."""
        try:
            register_when_free(self._agent, fid, segment, time, owner)
            return time
        except (FrontBehind, NonMonotonicHeartbeat):
            promised = self._agent.status()["fronts"].get(str(fid), [segment, -1])[1]
            time = max(time, self._floor(segment), int(promised))
            register_when_free(self._agent, fid, segment, time, owner)
            return time

    def _floor(self, *segments: str) -> int:
        """What ``segments`` already announced (their highest min time, from one status
        call): a new front starts there."""
        return max((int(s["min_time"]) for s in self._agent.status()["segments"]
                    if s["segment"] in segments), default=-1)

    def _leave(self, feed: Feed, owner: str) -> None:
        self.items.remove(feed)  # first: no more acks into a segment about to go
        # its segment may be detached first: then its fronts are gone already
        with contextlib.suppress(LowtideError):
            self._agent.unregister_front(feed.front_id, owner=owner)
        log.info("front left a released consumer",
                 extra={"front": self.front, "segment": feed.segment})

    def _graph_with(self, *segments: str) -> Any:
        """The agent's graph once it has ``segments`` attached (the tracker's current
        generation), else None."""
        graph = self._agent.graph
        if not all(s in graph for s in segments):
            graph = self._agent.follow_graph()
        live = all(s in graph and not graph.is_detached(graph.index(s)) for s in segments)
        return graph if live else None
