"""A ``lowtide.Front`` producer under chaos: records labelled by a real front and
written to a "topic" (a file of JSON lines, one per labelled batch), read by the
consumer. Its faults are the ones a producer meets: killed right after a write, inside
the agent's flush interval (``producer crash``), stopped cleanly while the tracker
is down (``tracker outage under a producer``), and killed while its front joins a query
attached to its topic (``front killed mid-join``: its front shares a joins directory
with the topic's queries); a successor with the same front and owner takes over from
what the topic holds.

The front's clock (:class:`LineClock`) counts the lines of its topic from
``FIRST_SLOT``, as the keyed fronts count their batches, so its labels share their
slots and the sink's end. The bench steers the process
through a control file, armed before it starts (it may write faster than the
consumer reads): ``crash@K`` (SIGKILL itself right after writing line K), ``pause@K``
(after writing line K, wait until told ``go``). SIGTERM stops it cleanly (exit 0)
from wherever it is: a label still waiting for the tracker's confirmation is
abandoned, its batch never written.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from lowtide.bench.chaos.workload import (
    FIRST_SLOT,
    GRAPH,
    ITEMS_PER_SLOT,
    Journal,
    Workload,
    joins_path,
    topic_lines,
    topic_path,
)
from lowtide.core.time import TimeGrid
from lowtide.spark.sources import Front
from lowtide.spark.tracking import TrackerRef

GRID = TimeGrid()
OWNER = "chaos-producer"


class LineClock:
    """The producer's clock: slot ``FIRST_SLOT + k`` while it writes line k of its
    topic, as the keyed fronts send slot ``FIRST_SLOT + k`` as their k-th batch; a
    successor starts at the first line not yet written."""

    def __init__(self, lines: int) -> None:
        self.lines = lines

    def now_ms(self) -> int:
        return (FIRST_SLOT + self.lines) * GRID.delta_ms


def control_path(journal_dir: Path, front: int) -> Path:
    return journal_dir / f"producer-{front}.ctl"


def command(journal_dir: Path, front: int) -> str:
    path = control_path(journal_dir, front)
    return path.read_text().strip() if path.exists() else ""


def tell(journal_dir: Path, front: int, what: str) -> None:
    path = control_path(journal_dir, front)
    path.with_suffix(".tmp").write_text(what)
    path.with_suffix(".tmp").replace(path)


def producer_process(url: str, work: Workload, front: int, journal_dir: str, go: Any) -> None:
    """Produce ``work.slots`` batches of the topic (a successor resumes after the last
    line written), one per ``pace_ms``; then heartbeat past the end and unregister."""
    jdir = Path(journal_dir)
    notes = Journal(jdir / f"front-{front}.log")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    secret = work.secret.decode() if work.secret else None
    ref = TrackerRef(url, GRAPH, GRID, secret)
    with notes.failures():
        clock = LineClock(len(topic_lines(jdir, front)))
        producer = Front(None, front, ref, segment="src", clock=clock, heartbeat_ms=5,
                         owner=f"{OWNER}-{front}", joins_dir=joins_path(jdir))
        notes.note("registered", front)
        go.wait(60)
        for k in range(clock.lines, work.slots):
            _produce(producer, jdir, front, k, notes)
            clock.lines = k + 1
            _obey(jdir, front, k)
            time.sleep(work.pace_ms / 1000)
        producer.close(unregister=True)  # its last heartbeat: the sink's end
        notes.note("done", front)


def _produce(producer: Front, jdir: Path, front: int, k: int, notes: Journal) -> None:
    batch = producer.label([b"x"] * ITEMS_PER_SLOT)  # the tracker has the acks (durable)
    slot = int(batch.times.min())
    notes.note("sent", front, slot)
    line = json.dumps({"k": k, "times": batch.times.tolist(), "acks": batch.acks.tolist()})
    with topic_path(jdir, front).open("a") as topic:  # in the OS once written: a killed
        topic.write(line + "\n")  # process loses nothing (no fsync, so a crash lands
        topic.flush()  # right inside the agent's flush interval)
    producer.written(batch)


def _obey(jdir: Path, front: int, k: int) -> None:
    """What the bench armed: crash now (inside the agent's flush interval), or wait."""
    what, _at, line = command(jdir, front).partition("@")
    if not line or int(line) != k:
        return
    if what == "crash":
        tell(jdir, front, "")
        os.kill(os.getpid(), signal.SIGKILL)
    if what == "pause":
        tell(jdir, front, "paused")
        while command(jdir, front) == "paused":
            time.sleep(0.005)
