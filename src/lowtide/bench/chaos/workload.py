"""The good clients of ``lowtide bench chaos``: a pipeline whose ground truth is known.

Graph ``src -> sink``. Each front process sends its items of slot s into ``src`` (one
keyed batch with its heartbeat, rule 3 and 6); the consumer process receives them out
of ``src`` and sends one child each into ``sink``, then receives the children out of
``sink`` (holding every ``hold_every``-th slot for ``hold_ms``, so items stay in flight
long enough for a premature notification to be seen). Every process appends what it
did to its own journal, with the system-wide monotonic clock (comparable across
processes): ``sent F S NS`` before a front's batch goes out, ``recv SEG F S NS`` before
a receive batch goes out.

A notification "SEG passed t" seen at ``w`` is premature when an item of SEG with slot
< t was first handed to the tracker for receipt after ``w``: the tracker cannot have
applied its receive-ack by then. The first journal line of an item is a lower bound of
when its receipt was applied, so a flagged notification is premature for certain.
Processes retry a call that failed (the tracker was killed, refused, or is restarting)
with the same key: keyed batches apply at most once.

A scenario may add ``producers``: real ``lowtide.Front`` producers
(:mod:`~lowtide.bench.chaos.producer`) that write labelled batches to a *topic* file,
one JSON line per batch; the consumer receives line k with the keyed fronts' slot k.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from lowtide.core.acks import child_acks, root_acks
from lowtide.core.errors import ProtocolError
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import AckBatch, Heartbeat
from lowtide.service import Agent, BatchKey
from lowtide.spark.sources import from_label
from lowtide.wire import BatchState

GRAPH = SegmentGraph.of(("src", ()), ("sink", ("src",)))
ITEMS_PER_SLOT = 20
FIRST_SLOT = 1_000  # slots start here, so a skewed front's slots stay positive
QUERY = "chaos"
COVERS: dict[str | None, tuple[str, ...]] = {"src": ("src",), "sink": ("src", "sink"),
                                              None: ("src", "sink"),
                                              # the query a fault attaches to a topic
                                              "joined": ("joined",),
                                              "joined_sink": ("joined", "joined_sink")}
#: the journals of consumers: the workload's, and the query the join fault attaches
CONSUMER_JOURNALS = ("consumer.log", "joined.log")
T = TypeVar("T")


@dataclass(frozen=True)
class Workload:
    slots: int = 40
    fronts: tuple[int, ...] = (0, 1)
    pace_ms: float = 25.0  # between a front's slots
    hold_every: int = 6
    hold_ms: float = 250.0
    secret: bytes | None = None
    producers: tuple[int, ...] = ()  # fronts of lowtide.Front producers (a topic each)
    #: this front goes silent for good a third of the way in (its producer hangs or
    #: died; it never unregisters): the tracker's dead-front policy must retire it
    dead_front: int | None = None
    #: every this many slots the consumer's batch takes slow_ms (reported open to the
    #: tracker, as a Spark driver does): far past stuck_after_ms, never a loss
    slow_every: int = 0
    slow_ms: float = 2_000.0

    def final_time(self, skew: dict[int, int]) -> int:
        """The sink's min time once every front's last heartbeat is in."""
        return FIRST_SLOT + self.slots + min(skew.get(f, 0) for f in self.fronts)


def now_ns() -> int:
    return time.monotonic_ns()


def item_values(front: int, slot: int) -> np.ndarray:
    seq = np.arange(slot * 1_000, slot * 1_000 + ITEMS_PER_SLOT, dtype=np.uint64)
    return root_acks(front, seq)


def sent_into_src(front: int, slot: int) -> AckBatch:
    return AckBatch.from_columns(0, np.full(ITEMS_PER_SLOT, slot), item_values(front, slot), 1)


def received(front: int, slot: int) -> tuple[AckBatch, AckBatch]:
    """(receipt out of src with the children's send into sink, receipt out of sink)."""
    parents = item_values(front, slot)
    return receipts(np.full(len(parents), slot), parents)


def receipts(times: np.ndarray, parents: np.ndarray,
             segments: tuple[int, int] = (0, 1)) -> tuple[AckBatch, AckBatch]:
    """:func:`received` of any items (times, root ack values), out of ``segments``
    (a source and its sink: src and sink by default)."""
    source, sink = segments
    children = child_acks(parents, operator=1, child_index=np.zeros(len(parents), np.uint64))
    first = AckBatch.concat([AckBatch.from_columns(sink, times, children, 1),
                             AckBatch.from_columns(source, times, parents, -1)])
    return first, AckBatch.from_columns(sink, times, children, -1)


def retry(call: Callable[..., T], *args: Any) -> T:
    """Call until it succeeds (for two minutes at most): the tracker may be down,
    restarting or failed-stop. A refusal (a core protocol error) is final: raised."""
    end = time.monotonic() + 120.0
    while True:
        try:
            return call(*args)
        except ProtocolError:
            raise
        except Exception:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def send(notes: Journal, agent: Agent, key: BatchKey, acks: AckBatch,
          heartbeats: list[Heartbeat] | None = None) -> None:
    """A keyed batch, retried until confirmed; a refusal is journaled (a tracker that
    refuses a receipt because its min time passed it already was premature)."""
    try:
        retry(agent.send_batch, key, acks, heartbeats or (), 5)
    except ProtocolError as exc:
        notes.note("refused", key.segment, key.partition, key.batch_id, type(exc).__name__)


class Journal:
    def __init__(self, path: Path) -> None:
        self._file = path.open("a", buffering=1)
        # a client process's own warnings (a refused flush) are the bench's findings,
        # reported in its table: keep them off the terminal
        logging.getLogger("lowtide").setLevel(logging.ERROR)

    def note(self, *fields: object) -> None:
        self._file.write(" ".join(map(str, (*fields, now_ns()))) + "\n")

    @contextlib.contextmanager
    def failures(self) -> Iterator[None]:
        """Journal why the process failed, for the bench to say."""
        try:
            yield
        except Exception as exc:
            self.note("failed", repr(exc).replace("\n", " ")[:300])
            raise


def front_process(url: str, work: Workload, front: int, skew: int, journal: str,
                  go: Any) -> None:
    """One front: registers itself, waits until every front has (``go``: none may start
    behind a min time the others moved), then sends each slot's items with the
    heartbeat past them. ``skew``: its clock is that many slots off the others'."""
    notes = Journal(Path(journal))
    with notes.failures(), Agent.connect(url, GRAPH, secret=work.secret) as agent:
        retry(agent.register_front, front, "src", FIRST_SLOT + skew, 5)
        notes.note("registered", front)
        go.wait(60)
        for k in range(work.slots):
            if front == work.dead_front and k == work.slots // 3:
                notes.note("stopped", front, "dead")
                time.sleep(3_600)  # silent, registered, until the bench kills it
            slot = FIRST_SLOT + skew + k
            notes.note("sent", front, slot)
            key = BatchKey(QUERY, k, "src", front)
            heartbeat = [Heartbeat(front, slot + 1)]
            send(notes, agent, key, sent_into_src(front, slot), heartbeat)
            time.sleep(work.pace_ms / 1000)


def front_state(journal_dir: Path, front: int) -> tuple[set[int], bool]:
    """(slots the front has sent, whether it stopped sending)."""
    lines = list(_lines(journal_dir / f"front-{front}.log"))
    return {int(f[2]) for f in lines if f[0] == "sent"}, any(f[0] == "stopped" for f in lines)


def consumer_process(url: str, work: Workload, skew: dict[int, int], journal_dir: str) -> None:
    """Receives every front's items in slot order (waiting until each was sent), and
    holds some of the children in ``sink`` for a while. A restarted consumer starts
    again from the first slot: its batches keep their keys, so nothing applies twice."""
    jdir = Path(journal_dir)
    notes = Journal(jdir / "consumer.log")
    with notes.failures(), Agent.connect(url, GRAPH, secret=work.secret) as agent:
        stopped: set[int] = set()
        batches = ConsumerBatches(agent, work, jdir)
        for k in range(work.slots):
            batches.before(k)
            for front in work.fronts:
                slot = FIRST_SLOT + skew.get(front, 0) + k
                if front in stopped or not _await_sent(jdir, front, slot):
                    stopped.add(front)
                    continue
                _receive(notes, agent, work, k, front, slot, received(front, slot))
            for front in work.producers:
                line = await_line(jdir, front, k)
                times = np.asarray(line["times"], np.int64)
                _receive(notes, agent, work, k, front, int(times.min()),
                         receipts(times, from_label(line["acks"])))
        batches.close()


class ConsumerBatches:
    """The consumer's micro-batches, as a Spark driver reports them (only with
    ``work.slow_every``): a batch takes every slot the fronts had sent when it began,
    and every ``slow_every``-th batch first takes ``slow_ms`` (its driver saying it
    still runs), so the slots sent meanwhile are read by the next batch."""

    def __init__(self, agent: Agent, work: Workload, jdir: Path) -> None:
        self.agent, self.work, self.jdir = agent, work, jdir
        self.batch, self.until = -1, 0

    def _say(self, state: BatchState) -> None:
        retry(self.agent.report_batch, QUERY, self.batch, state, GRAPH.names)

    def before(self, k: int) -> None:
        """Slot ``k`` is next: in this batch, or the first of the next one."""
        if not self.work.slow_every or k < self.until:
            return
        self.close()
        self.batch += 1
        self._say(BatchState.OPEN)
        if self.batch % self.work.slow_every == self.work.slow_every - 1:
            end = time.monotonic() + self.work.slow_ms / 1000
            while time.monotonic() < end:
                time.sleep(0.25)
                self._say(BatchState.OPEN)
        live = [front_state(self.jdir, f) for f in self.work.fronts]
        sent = [len(slots) for slots, stopped in live if not stopped]
        self.until = max(k + 1, min(sent, default=0))

    def close(self) -> None:
        if self.batch >= 0:
            self._say(BatchState.CLOSED)


def _receive(notes: Journal, agent: Agent, work: Workload, k: int, front: int, slot: int,
             batches: tuple[AckBatch, AckBatch]) -> None:
    first, second = batches
    notes.note("recv", "src", front, slot)
    send(notes, agent, BatchKey(QUERY, k, "sink", front), first)
    if k % work.hold_every == work.hold_every - 1:
        time.sleep(work.hold_ms / 1000)
    notes.note("recv", "sink", front, slot)
    send(notes, agent, BatchKey(QUERY, k, "out", front), second)


def topic_path(journal_dir: Path, front: int) -> Path:
    """Where producer ``front`` writes its labelled batches, one JSON line each."""
    return journal_dir / f"topic-{front}.jsonl"


def joins_path(journal_dir: Path) -> Path:
    """The directory a producer's front shares with the queries of its topic, through
    which it joins a query attached while it runs (``Front(joins_dir=)``)."""
    return journal_dir / "joins"


def topic_lines(journal_dir: Path, front: int) -> list[dict[str, Any]]:
    """The complete lines of a topic (a line is written whole, then synced)."""
    path = topic_path(journal_dir, front)
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def await_line(journal_dir: Path, front: int, k: int) -> dict[str, Any]:
    """Line ``k`` of a producer's topic, once written (by it or its successor)."""
    end = time.monotonic() + 120.0
    while True:
        lines = topic_lines(journal_dir, front)
        if len(lines) > k:
            return lines[k]
        if time.monotonic() > end:
            raise TimeoutError(f"producer {front} wrote no line {k} in 120 s")
        time.sleep(0.005)


def _await_sent(journal_dir: Path, front: int, slot: int) -> bool:
    while True:
        sent, stopped = front_state(journal_dir, front)
        if slot in sent:
            return True
        if stopped:
            return False
        time.sleep(0.005)


def rogue_front_process(url: str, work: Workload, front: int, journal: str, go: Any) -> None:
    """A front one of whose buffered flushes the tracker refuses (one ack 2**21 slots
    ahead of its window) and which then goes on sending items and heartbeats, fire and
    forget. Until it learns of the refusal (a call raises) it journals what it sent."""
    notes = Journal(Path(journal))
    with notes.failures(), Agent.connect(url, GRAPH, secret=work.secret) as agent:
        retry(agent.register_front, front, "src", FIRST_SLOT, 5)
        notes.note("registered", front)
        go.wait(60)
        try:
            for k in range(work.slots):
                slot = FIRST_SLOT + k
                acks = sent_into_src(front, slot)
                if k == work.hold_every - 1:  # the consumer holds this slot: in flight
                    far = AckBatch.from_columns(0, np.array([slot + (1 << 21)]),
                                                np.array([0xBAD], np.uint64), 1)
                    acks = AckBatch.concat([acks, far])
                notes.note("sent", front, slot)
                agent.add_acks(acks)
                agent.heartbeat(front, slot + 1)
                time.sleep(work.pace_ms / 1000)
            agent.flush(timeout_s=10)
        except Exception as exc:  # the refusal reached this front: it stops
            notes.note("stopped", front, type(exc).__name__)


@dataclass(frozen=True)
class Truth:
    """What the journals say: when each item (segment, front, slot) was first handed
    over for receipt, and when each slot's last sink receipt was (its latest attempt:
    the moment the slot was done from the clients' side)."""

    first_recv_ns: dict[tuple[str, int, int], int]  # (segment, front, slot)
    sink_sent_ns: dict[int, int]
    #: receipts the tracker refused as behind its head: a min time had passed them
    behind: tuple[str, ...] = ()

    @classmethod
    def read(cls, journal_dir: Path) -> Truth:
        first: dict[tuple[str, int, int], int] = {}
        last: dict[tuple[int, int], int] = {}
        behind = []
        for fields in (f for name in CONSUMER_JOURNALS for f in _lines(journal_dir / name)):
            if fields[:1] == ["refused"] and "AckBehindHead" in fields:
                behind.append(f"the receipt of front {fields[2]}'s batch {fields[3]} was "
                              "refused: a min time had passed it")
            if fields[0] == "recv":
                seg, front, slot, ns = fields[1], int(fields[2]), int(fields[3]), int(fields[4])
                first[(seg, front, slot)] = min(first.get((seg, front, slot), ns), ns)
                if seg == "sink":
                    last[(front, slot)] = max(last.get((front, slot), ns), ns)
        sink_sent: dict[int, int] = {}
        for (_front, slot), ns in last.items():
            sink_sent[slot] = max(sink_sent.get(slot, 0), ns)
        return cls(first, sink_sent, tuple(behind))

    def premature(self, seen: list[tuple[str | None, int, int]]) -> list[str]:
        """Notifications that claimed a time while an item below it was in flight in
        that segment or upstream of it (sink's min time covers src's items too), and
        receipts refused because such a notification had been made."""
        out = list(self.behind)
        for segment, t, at_ns in seen:
            covered = COVERS[segment]
            late = [(s, covered.index(seg), f) for (seg, f, s), ns in self.first_recv_ns.items()
                    if s < t and ns > at_ns and seg in covered]
            if late:  # the earliest slot, the most upstream segment
                s, k, f = min(late)
                seg = covered[k]
                out.append(f"{segment or 'global'} passed {t} while front {f}'s slot {s}"
                           f" was in flight in {seg}")
        return out

    def notify_delays_ms(self, seen: list[tuple[str | None, int, int]]) -> list[float]:
        """Per slot: from its last sink receipt handed to the agent to the first sink
        notification past it (the agent, loopback, the tracker's queue and step)."""
        sink = sorted((ns, t) for seg, t, ns in seen if seg == "sink")
        delays = []
        for slot, sent in self.sink_sent_ns.items():
            at = next((ns for ns, t in sink if t > slot and ns >= sent), None)
            if at is not None:
                delays.append((at - sent) / 1e6)
        return delays


def _lines(path: Path) -> Iterator[list[str]]:
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            fields = line.split()
            if fields:
                yield fields
