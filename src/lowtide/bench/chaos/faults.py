"""Faults injected into a running scenario: kills, damaged log files, a full disk.

Each fault takes the :class:`~lowtide.bench.chaos.run.Run` and counts itself there. A
tracker that refuses to start on what it found (a damaged log it must not guess
around) is counted as a refused start, and the operator's documented way out is taken:
restore the state dir from the copy taken before the damage.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from lowtide.bench.chaos.producer import command, tell
from lowtide.bench.chaos.workload import GRAPH
from lowtide.core.messages import Ack, AckBatch
from lowtide.service import Agent, BatchKey

if TYPE_CHECKING:
    from lowtide.bench.chaos.run import Run

Fault = Callable[["Run"], None]


def kill_tracker(run: Run) -> None:
    run.faults += 1
    run.tracker.kill9()
    time.sleep(0.3)  # clients notice, retry, and resend once it is back
    run.restart_tracker()


def kill_leader(run: Run) -> None:
    """kill -9 a group's leader: the standby takes over; the killed one comes back as
    the standby (as a supervisor would restart it)."""
    assert run.group is not None
    run.faults += 1
    leader = run.group.members[run.group.leader]
    killed = time.monotonic()
    leader.kill9()
    _failed_over(run, killed)
    leader.start(standby=True)


def partition_leader(run: Run) -> None:
    """SIGSTOP a group's leader (alive, silent: a partition) until the standby took
    over, then wake it: it must find itself fenced and stop (exit 4), confirming and
    announcing nothing more; its clients go to the new leader."""
    assert run.group is not None
    run.faults += 1
    leader = run.group.members[run.group.leader]
    assert leader.proc is not None
    stopped = time.monotonic()
    os.kill(leader.proc.pid, signal.SIGSTOP)
    try:
        _failed_over(run, stopped)
    finally:
        os.kill(leader.proc.pid, signal.SIGCONT)
    try:
        code = leader.proc.wait(30)
    except subprocess.TimeoutExpired:
        code = None
    if code != 4:
        run.premature.append(f"the deposed leader went on serving (exit {code})")
    leader.kill9()
    leader.start(standby=True)


def _failed_over(run: Run, since: float) -> None:
    assert run.group is not None
    seconds = run.group.take_over(since)
    if seconds is None:
        run.say("the standby did not take over in 30 s")
    else:
        run.failover_s.append(seconds)
        run.say(f"the standby took over in {seconds:.1f} s")


def kill_consumer(run: Run) -> None:
    run.faults += 1
    run.kill_consumer()
    run.start_consumer()


def kill_shard(run: Run) -> None:
    pids = run.shard_pids()
    if not pids:
        run.say("no shard pid known: nothing killed")
        return
    os.kill(pids[0], signal.SIGKILL)
    run.faults += 1  # the coordinator restarts it on the same port and state


def flip_mid_log_byte(run: Run) -> None:
    """A bit rot in the middle of the first log file (not a torn tail)."""
    run.tracker.kill9()
    backup = run.tmp / "state-backup"
    shutil.copytree(run.tracker.state_dir, backup)
    files = [p for p in run.tracker.wal_files() if p.stat().st_size > 64]
    if not files:
        run.say("no log file to damage")
    else:
        path = files[0]
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x40
        path.write_bytes(bytes(data))
    _restart_or_restore(run, backup)


def torn_tail(run: Run) -> None:
    """The tracker died while writing a record: a partial record ends the last log
    file (recovery may drop exactly that, and the clients resend it)."""
    run.tracker.kill9()
    files = run.tracker.wal_files()
    if files:
        with files[-1].open("ab") as f:
            f.write(files[-1].read_bytes()[:11] or b"\x00" * 11)
    run.faults += 1
    if not run.tracker.start():
        run.refused_starts += 1
        run.say("refused to start after a torn tail (it should recover)")


def full_disk(run: Run) -> None:
    """Writes fail (EFBIG under a 4 KiB file size limit) for a second; then the space
    is back and the tracker is restarted on its state dir."""
    run.tracker.kill9()
    run.faults += 1
    if run.tracker.start(file_limit_bytes=4096):
        time.sleep(1.0)
        run.tracker.kill9()
    else:
        run.refused_starts += 1
    run.restart_tracker()


def crash_producer(run: Run) -> None:
    """The Front producer is killed right after a write, inside its agent's flush
    interval; a successor (same front and owner) goes on from what its topic holds."""
    run.producer.join(30)  # it was armed with "crash@K" (Scenario.producer)
    if run.producer.exitcode != -signal.SIGKILL:
        run.say(f"the producer was not killed (exit {run.producer.exitcode})")
        return
    run.faults += 1
    run.start_producer()


def outage_under_producer(run: Run) -> None:
    """The tracker is killed under the Front producer, which then stops cleanly (exit
    0) while a label waits for the tracker; the tracker restarts and a successor (same
    front and owner) goes on from what the topic holds."""
    jdir, front = run.journal, run.producer_front
    deadline = time.monotonic() + 30  # armed "pause@K": no label is on its way then
    while command(jdir, front) != "paused" and time.monotonic() < deadline:
        time.sleep(0.005)
    run.tracker.kill9()
    tell(jdir, front, "go")
    time.sleep(0.3)  # its next label now waits for a tracker that is down
    os.kill(run.producer.pid, signal.SIGTERM)
    run.producer.join(30)
    if run.producer.exitcode != 0:
        run.say(f"the producer did not stop cleanly (exit {run.producer.exitcode})")
    run.faults += 1
    run.restart_tracker()
    run.start_producer()


#: the front of the query the "graph changed" fault attaches (apart from the workload's)
ATTACHED_FRONT = 77


def change_graph(run: Run) -> None:
    """Under load, attach a second query to the running tracker (rule 16), put an item
    through it and leave one in flight, then detach it: the running query's min times
    stay exact (the truth checks every one of them), the attached query's sink is never
    announced past its item in flight, and the detach reports that item."""
    run.faults += 1
    with Agent.connect(run.tracker.url, GRAPH, secret=run.work.secret) as agent:
        graph = agent.change_graph(attach=[("src2", ()), ("sink2", ("src2",))])
        start = agent.status()["global_min"]
        src2, sink2 = graph.index("src2"), graph.index("sink2")
        agent.register_front(ATTACHED_FRONT, "src2", start)
        key = BatchKey("graph-changed", 0, "src2", ATTACHED_FRONT)
        agent.send_batch(key, AckBatch.of([Ack(src2, start, 0xC1, +1)]))
        agent.send_batch(BatchKey("graph-changed", 0, "sink2", 0),
                         AckBatch.of([Ack(sink2, start, 0xC2, +1), Ack(src2, start, 0xC1, -1)]))
        agent.heartbeat(ATTACHED_FRONT, start + 50)
        agent.flush()
        time.sleep(0.3)
        mins = {s["segment"]: s["min_time"] for s in agent.status()["segments"]}
        if mins["sink2"] > start:
            run.premature.append(f"sink2 announced {mins['sink2']} with an item at {start}")
        gone = agent.status()["generation"]
        agent.change_graph(detach=["sink2", "src2"])
        detached = agent.status()["generations"][gone]["detached"]
        run.say(f"graph changed: attached and detached a query; {'; '.join(detached)}")


def _restart_or_restore(run: Run, backup: os.PathLike[str]) -> None:
    run.faults += 1
    if run.tracker.start():
        return
    run.refused_starts += 1
    shutil.rmtree(run.tracker.state_dir)
    shutil.copytree(backup, run.tracker.state_dir)
    run.restart_tracker()
