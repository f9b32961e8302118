"""One chaos scenario: a tracker process, good clients with a known ground truth, the
faults, and the verdict (premature notifications, lost ones, notification delays)."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lowtide.bench.chaos import hostile
from lowtide.bench.chaos.faults import Fault
from lowtide.bench.chaos.producer import producer_process, tell
from lowtide.bench.chaos.tracker import TrackerGroup, TrackerProcess
from lowtide.bench.chaos.workload import (
    GRAPH,
    QUERY,
    Truth,
    Workload,
    consumer_process,
    front_process,
    rogue_front_process,
)
from lowtide.core.messages import MinTimeUpdate
from lowtide.core.open_batches import STARTING
from lowtide.service import Agent
from lowtide.wire import BatchState

ROGUE_FRONT = 7
PRODUCER_FRONT = 5


@dataclass(frozen=True)
class Scenario:
    name: str
    faults: tuple[Fault, ...] = ()  # one after another, from a third of the way in
    shards: int = 0
    skew: tuple[tuple[int, int], ...] = ()  # (front, slots its clock is off)
    rogue: bool = False  # a front whose refused flush must hold the min times back
    attacks: tuple[str, ...] = ()  # hostile peers while the work runs (see hostile.Attack)
    nofile: int | None = None  # the tracker's file limit (ulimit -n), snapshots often
    serve_args: tuple[str, ...] = ()  # more `lowtide serve` options
    #: a lowtide.Front producer writing a topic (producer.py), armed with "crash" or
    #: "pause" at its middle line for the faults; "": no producer
    producer: str = ""
    probe: Callable[[bytes | None], bool] | None = None  # True: the probe was fooled
    #: True: a good client was kept out for good (counted as lost)
    lockout_probe: Callable[[bytes | None], bool] | None = None
    dead_front: bool = False  # the last front goes silent a third of the way in
    slow_every: int = 0  # every this many batches of the consumer is slow (reported open)
    standby: bool = False  # a leader and a standby sharing a step log in Kafka (--ha)

    @property
    def expect_complete(self) -> bool:
        """A refused flush is never applied: that front's items stay unbalanced."""
        return not self.rogue and self.probe is None and self.lockout_probe is None


@dataclass
class Result:
    name: str
    faults: int = 0
    refused_starts: int = 0
    premature: list[str] = field(default_factory=list)
    lost: int = 0
    delays_ms: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    false_losses: int = 0  # "missing" reports of the tracker (nothing is ever lost here)
    retired: int = 0  # fronts the tracker retired as dead
    failover_s: list[float] = field(default_factory=list)  # until the standby served
    left_behind: int = 0  # files a stopped query left in a sink's staging folder


class Run:
    """What faults act on: the tracker process, the consumer process, the counters."""

    def __init__(self, tmp: Path, work: Workload, scenario: Scenario, secret_file: Path,
                 bootstrap: str | None = None) -> None:
        self.tmp, self.work, self.scenario = tmp, work, scenario
        self.tracker = TrackerProcess(tmp, shards=scenario.shards, secret_file=secret_file,
                                      nofile=scenario.nofile, args=scenario.serve_args)
        self.group = None  # with scenario.standby: the leader and its standby, not tracker
        if scenario.standby:
            assert bootstrap is not None, "a standby scenario needs a Kafka broker"
            self.group = TrackerGroup(tmp, bootstrap, secret_file=secret_file,
                                      args=scenario.serve_args)
        self.failover_s: list[float] = []
        self.journal = tmp / "journal"
        self.journal.mkdir()
        self.ctx = multiprocessing.get_context("spawn")
        self.go = self.ctx.Event()
        self.procs: list[Any] = []
        self.consumer: Any = None
        self.seen: list[tuple[str | None, int, int]] = []
        self.faults = 0
        self.refused_starts = 0
        self.notes: list[str] = []
        self.premature: list[str] = []  # what a fault saw announced too early itself
        self.lost = 0  # outputs a fault saw never complete itself
        self.skew = dict(scenario.skew)
        self.producer: Any = None
        self.producer_front = PRODUCER_FRONT

    def say(self, note: str) -> None:
        self.notes.append(note)

    @property
    def url(self) -> str:
        """What clients dial: the tracker, or both of a group's."""
        return self.tracker.url if self.group is None else self.group.url

    def start_tracker(self) -> bool:
        return self.tracker.start() if self.group is None else self.group.start()

    def restart_tracker(self) -> None:
        if not self.tracker.start():
            self.refused_starts += 1
            self.say(f"the tracker would not restart: see {self.tracker.log_path}")

    def start_producer(self) -> None:
        """The Front producer (again: a successor takes over its front and topic)."""
        self.producer = self.ctx.Process(target=producer_process, args=(
            self.url, self.work, self.producer_front, str(self.journal), self.go))
        self.producer.start()
        self.procs.append(self.producer)

    def start_consumer(self) -> None:
        fronts = (*self.work.fronts, *((ROGUE_FRONT,) if self.scenario.rogue else ()))
        producers = (PRODUCER_FRONT,) if self.scenario.producer else ()
        work = replace(self.work, fronts=fronts, producers=producers)
        self.consumer = self.ctx.Process(
            target=consumer_process, args=(self.url, work, self.skew, str(self.journal)))
        self.consumer.start()

    def kill_consumer(self) -> None:
        self.consumer.kill()
        self.consumer.join(10)

    def shard_pids(self) -> list[int]:
        with Agent.connect(self.url, GRAPH, secret=self.work.secret) as agent:
            shards = agent.status(timeout_s=5).get("shards", [])
        return [int(s["status"]["pid"]) for s in shards if s.get("status")]

    def note_update(self, update: MinTimeUpdate) -> None:
        self.seen.append((update.segment, update.time, time.monotonic_ns()))

    def start_fronts(self) -> None:
        """Fronts register one at a time, least skewed first, then all start together:
        a front registered ahead of the others would move the min time past the slots
        the others start at."""
        starts = [(self.skew.get(f, 0), front_process,
                   (self.url, self.work, f, self.skew.get(f, 0),
                    str(self.journal / f"front-{f}.log"), self.go))
                  for f in self.work.fronts]
        if self.scenario.rogue:
            starts.append((0, rogue_front_process,
                           (self.url, self.work, ROGUE_FRONT,
                            str(self.journal / f"front-{ROGUE_FRONT}.log"), self.go)))
        for _skew, target, args in sorted(starts, key=lambda s: s[0]):
            self.procs.append(self.ctx.Process(target=target, args=args))
            self.procs[-1].start()
            _wait(lambda: self._registered() == len(self.procs), 60, "fronts to register",
                  self.procs, self.journal)
        if self.scenario.producer:
            tell(self.journal, self.producer_front,
                 f"{self.scenario.producer}@{self.work.slots // 2}")
            self.start_producer()
            _wait(lambda: self._registered() == len(self.procs), 60, "the producer",
                  self.procs, self.journal)
        self.go.set()

    def _registered(self) -> int:
        return sum(1 for p in self.journal.glob("front-*.log")
                   if "registered" in p.read_text())

    def done_slots(self) -> int:
        path = self.journal / "consumer.log"
        return path.read_text().count(" sink ") if path.exists() else 0

    def stop(self) -> None:
        for p in [*self.procs, *([self.consumer] if self.consumer else [])]:
            if p.is_alive():
                p.kill()
            p.join(10)
        self.tracker.kill9()
        if self.group is not None:
            self.group.kill9()


def run_scenario(tmp: Path, work: Workload, scenario: Scenario, secret_file: Path,
                 bootstrap: str | None = None) -> Result:
    started = time.monotonic()
    if scenario.probe is not None:
        fooled = scenario.probe(work.secret)
        premature = [f"{scenario.name}: believed a peer without the secret"] if fooled else []
        return Result(scenario.name, faults=1, premature=premature,
                      seconds=time.monotonic() - started)
    if scenario.lockout_probe is not None:
        locked_out = scenario.lockout_probe(work.secret)
        return Result(scenario.name, faults=1, lost=int(locked_out),
                      notes=["a good client was kept out"] if locked_out else [],
                      seconds=time.monotonic() - started)
    work = replace(work, dead_front=work.fronts[-1] if scenario.dead_front else None,
                   slow_every=scenario.slow_every)
    run = Run(tmp, work, scenario, secret_file, bootstrap)
    watcher = attack = None
    try:
        if not run.start_tracker():
            raise RuntimeError(f"the tracker did not start: see {run.tracker.log_path}")
        watcher = Agent.connect(run.url, GRAPH, secret=work.secret)
        for segment in ("src", "sink"):
            watcher.on_update(run.note_update, segment)
        if scenario.slow_every:  # as a pipeline does when its tracker starts
            watcher.report_batch(QUERY, STARTING, BatchState.OPEN, GRAPH.names)
        run.start_fronts()
        run.start_consumer()
        run.faults += scenario.rogue + bool(scenario.skew)
        if scenario.attacks:
            attack = hostile.Attack(run.url, work.secret, scenario.attacks)
            attack.start()
            run.faults += len(scenario.attacks)
        fronts = len(work.fronts) + scenario.rogue + bool(scenario.producer)
        try:
            _wait(lambda: run.done_slots() >= fronts * work.slots // 3, 60,
                  "a third of the work")
        except TimeoutError as exc:  # the tracker stopped serving: that run is lost
            run.say(str(exc))
            lost = 1
        else:
            for fault in scenario.faults:
                fault(run)
                time.sleep(0.3)
            lost = _finish(run, watcher, scenario)
    finally:
        if attack is not None:
            attack.stop()
            run.say("hostile peers sent: " + ", ".join(f"{k} {v}" for k, v in attack.sent.items()))
        if watcher is not None:
            watcher.close(timeout_s=2.0)
        run.stop()
    truth = Truth.read(run.journal)
    losses, retired = tracker_reports(run.tracker.log_path)
    if scenario.dead_front:
        run.faults += 1
        run.say(f"dead front {work.dead_front}: {retired} retirement(s) by the policy")
    if scenario.slow_every:
        run.faults += work.slots // scenario.slow_every
        run.say(f"slow batches of {work.slow_ms / 1000:g} s: {losses} loss report(s)")
    return Result(scenario.name, run.faults, run.refused_starts,
                  truth.premature(run.seen) + run.premature,
                  lost + run.lost, truth.notify_delays_ms(run.seen), run.notes,
                  time.monotonic() - started, losses, retired, run.failover_s)


def tracker_reports(log: Path) -> tuple[int, int]:
    """(stuck windows the tracker reported, fronts it retired as dead), from its log."""
    text = log.read_text() if log.exists() else ""
    lines = text.splitlines()
    return (sum("stuck window" in line for line in lines),
            sum("dead front" in line and "retired at" in line for line in lines))


def _finish(run: Run, watcher: Agent, scenario: Scenario) -> int:
    """Wait for the consumer, then for the sink's min time to reach the end: 1 if it
    never does (a lost notification), 0 if it does or is not expected to."""
    run.consumer.join(120)
    if not scenario.expect_complete:
        time.sleep(1.0)  # time for a premature notification to show
        return 0
    final = run.work.final_time(run.skew)
    try:
        _wait(lambda: any(s == "sink" and t >= final for s, t, _ in run.seen), 30, "the end")
    except TimeoutError:
        last = max((t for s, t, _ in run.seen if s == "sink"), default=None)
        run.say(f"sink stopped at {last}, expected {final}")
        return 1
    return 0


def _wait(ready: Callable[[], bool], timeout_s: float, what: str,
          procs: Sequence[Any] = (), journal: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        if any(p.exitcode not in (None, 0) for p in procs):
            why = [line for p in (journal.glob("*.log") if journal else ())
                   for line in p.read_text().splitlines() if line.startswith("failed ")]
            raise RuntimeError(f"a client process failed while waiting for {what}: {why}")
        time.sleep(0.02)
