"""The chaos fault "front killed mid-join": a query is attached to the producer's topic
while the producer runs (rule 16), and the producer is SIGKILLed while its front joins
that query (:data:`PHASES`): before it could register on the query's segment, while its
join waits on the tracker (paused for that moment), or after it answered. A successor
(same front and owner) joins the query or resumes the join; the query reads each line
of the topic, keeping the records labelled at or after the front's answered time, as
``read_stream(joins_dir=)`` does.

Checked: no notification of the query's segments passes a record it had not yet
received (the journal ``joined.log`` and :class:`~.workload.Truth`), the query's sink
reaches the end (the tracker balanced the front's send-acks with exactly the records
it kept), and what it kept equals the batch recomputation: every record of the whole
topic labelled at or after the answer's time, recomputed after the run.

The producer is killed while it waits between two lines (armed ``pause@K``), so no
label of the main query is cut in half: the main query's own faults are elsewhere.
"""

from __future__ import annotations

import os
import random
import signal
import time
from typing import TYPE_CHECKING

import numpy as np

from lowtide.bench.chaos.producer import command, tell
from lowtide.bench.chaos.workload import (
    FIRST_SLOT,
    GRAPH,
    Journal,
    await_line,
    joins_path,
    receipts,
    send,
    topic_lines,
)
from lowtide.service import Agent, BatchKey
from lowtide.spark.sources import from_label, request_join, start_times

if TYPE_CHECKING:
    from lowtide.bench.chaos.run import Run

#: the query attached to the producer's topic: its ingest segment and its sink
JOINED = [("joined", ()), ("joined_sink", ("joined",))]
#: where the kill lands in the front's join, one drawn per run (the table's note says
#: which): stopped before it could see the query's request; while its join waits on the
#: tracker (paused: SIGSTOP, then SIGCONT after the kill); once it answered
PHASES = ("before its registration", "during its join", "after its answer")
#: how long the tracker stays paused with the request out: twice the 0.2 s between a
#: front's looks for joins (FOLLOW_EVERY_S), so its join is under way when it is killed
PAUSED_S = 0.4


def kill_front_mid_join(run: Run, phase: str | None = None) -> None:
    """See the module docstring; ``phase``: one of :data:`PHASES` (None: drawn)."""
    jdir, front = run.journal, run.producer_front
    deadline = time.monotonic() + 30  # armed "pause@K": between two lines
    while command(jdir, front) != "paused" and time.monotonic() < deadline:
        time.sleep(0.005)
    phase = phase or random.choice(PHASES)
    with Agent.connect(run.url, GRAPH, secret=run.work.secret) as agent:
        agent.change_graph(attach=JOINED)
        for segment in ("joined", "joined_sink"):
            agent.on_update(run.note_update, segment)
        _kill_in(run, phase)
        tell(jdir, front, "")
        run.faults += 1
        run.start_producer()  # its successor joins the query, or resumes the join
        kept, start = _consume(run, agent)
        run.say(f"front killed mid-join ({phase}); joined at {start}, "
                f"{len(kept)} record(s) read")
        _check(run, agent, kept, start)


def _kill_in(run: Run, phase: str) -> None:
    """The query asks to be fed; the producer is SIGKILLed at ``phase`` of its join."""
    joins, pid = joins_path(run.journal), run.producer.pid
    if phase == PHASES[0]:
        os.kill(pid, signal.SIGSTOP)  # a stopped process is killed all the same
        request_join(joins, "joined", consumer="joined")
        os.kill(pid, signal.SIGKILL)
    elif phase == PHASES[1]:
        assert run.tracker.proc is not None
        tracker = run.tracker.proc.pid
        os.kill(tracker, signal.SIGSTOP)
        try:
            request_join(joins, "joined", consumer="joined")
            time.sleep(PAUSED_S)  # its follow saw the request and waits
            answered = start_times(joins, "joined", [run.producer_front])
            if answered[run.producer_front] is not None:
                run.say("the front answered while the tracker was paused")
            os.kill(pid, signal.SIGKILL)
        finally:
            os.kill(tracker, signal.SIGCONT)
    else:
        request_join(joins, "joined", consumer="joined")
        _await_answer(run)
        os.kill(pid, signal.SIGKILL)
    run.producer.join(30)


def _consume(run: Run, agent: Agent) -> tuple[set[tuple[int, int]], int]:
    """The attached query: each line of the topic, the records at or after the front's
    answered time, received out of ``joined`` and then out of ``joined_sink`` (held a
    while every few lines: a premature notification has time to show); returns the
    (time, ack) of the records it kept, and the answer's time."""
    jdir, front = run.journal, run.producer_front
    start = _await_answer(run)
    notes = Journal(jdir / "joined.log")
    segments = (agent.graph.index("joined"), agent.graph.index("joined_sink"))
    kept: set[tuple[int, int]] = set()
    for k in range(run.work.slots):
        line = await_line(jdir, front, k)
        times = np.asarray(line["times"], np.int64)
        acks = from_label(line["acks"])
        at = times >= start
        if not at.any():
            continue
        kept |= set(zip(times[at].tolist(), acks[at].tolist(), strict=True))
        first, second = receipts(times[at], acks[at], segments)
        slot = int(times[at].min())
        notes.note("recv", "joined", front, slot)
        send(notes, agent, BatchKey("joined", k, "joined_sink", front), first)
        if k % run.work.hold_every == 0:
            time.sleep(run.work.hold_ms / 1000)
        notes.note("recv", "joined_sink", front, slot)
        send(notes, agent, BatchKey("joined", k, "joined_out", front), second)
    return kept, start


def _await_answer(run: Run) -> int:
    """The time the producer's front answered the query (a successor first waits for
    its predecessor's lease to lapse)."""
    deadline = time.monotonic() + 60
    while True:
        (start,) = start_times(joins_path(run.journal), "joined", [run.producer_front]).values()
        if start is not None:
            return start
        if time.monotonic() > deadline:
            raise TimeoutError("the producer's front never joined the attached query")
        time.sleep(0.005)


def _check(run: Run, agent: Agent, kept: set[tuple[int, int]], start: int) -> None:
    """The query's sink reaches the end, and its records are the batch recomputation."""
    final = FIRST_SLOT + run.work.slots
    deadline = time.monotonic() + 30
    while not any(s == "joined_sink" and t >= final for s, t, _ in run.seen):
        if time.monotonic() > deadline:
            held = {s["segment"]: (s["min_time"], s["in_flight"])
                    for s in agent.status()["segments"] if s["segment"].startswith("joined")}
            run.say(f"the attached query's sink never reached {final}: {held}")
            run.lost += 1
            return
        time.sleep(0.02)
    batch = {(t, int(a)) for line in topic_lines(run.journal, run.producer_front)
             for t, a in zip(line["times"], from_label(line["acks"]).tolist(), strict=True)
             if t >= start}
    if kept != batch:
        run.say(f"the attached query read {len(kept)} record(s), the batch recomputation "
                f"{len(batch)}")
        run.lost += 1
