"""Helpers shared by the Spark tests: an in-process agent on the core tracker, and the
end-to-end checks."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lowtide.bench.chaos.task_failures import fail_once as fail_once  # the tests' task failures
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import AckBatch, Heartbeat, RegisterFront, UnregisterFront
from lowtide.core.time import TimeGrid
from lowtide.core.tracker import Tracker, TrackerConfig
from lowtide.spark.sources.generator import GeneratorSpec, rows_before


def free_port() -> int:
    """A loopback port nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Applied:
    """CoreAgent's pending batch: applied at once."""

    applied: bool

    def wait(self) -> bool:
        return self.applied


class CoreAgent:
    """An agent that applies straight to a core Tracker (no network): for pure tests
    of what the Spark layer sends. Keys are deduplicated as the service does; owner
    names are taken and ignored (every front belongs to owner 0: the service's tests
    check owners)."""

    def __init__(self, graph: SegmentGraph, grid: TimeGrid | None = None) -> None:
        self.graph = graph
        self.grid = grid or TimeGrid()
        self.tracker: Tracker = TrackerConfig(graph, self.grid).build()
        self.late: dict[int, tuple[int, int, int, int]] = {}  # front -> its late counts
        self.keys: set[Any] = set()
        self.batches: list[tuple[Any, AckBatch, tuple[Heartbeat, ...]]] = []
        self.lock = threading.Lock()

    def register_front(
        self, front: int, segment: str, time: int, timeout_s: float = 30.0, *, owner: str = ""
    ) -> None:
        with self.lock:
            self.tracker.register_front(RegisterFront(front, segment, time))

    def send_batch(self, key: Any, acks: AckBatch, heartbeats: Iterable[Heartbeat] = (),
                   timeout_s: float = 30.0, *, owner: str | None = None) -> bool:
        with self.lock:
            if key in self.keys:
                return False
            self.tracker.apply_flush(acks, tuple(heartbeats))
            self.keys.add(key)
            self.batches.append((key, acks, tuple(heartbeats)))
            return True

    def submit_batch(self, key: Any, acks: AckBatch, heartbeats: Iterable[Heartbeat] = (),
                     timeout_s: float = 30.0, *, owner: str | None = None) -> Applied:
        return Applied(self.send_batch(key, acks, heartbeats, timeout_s))

    def add_acks(self, acks: AckBatch) -> None:
        with self.lock:
            self.tracker.apply(acks)

    def heartbeat(self, front: int, time: int, *, owner: str | None = None) -> None:
        with self.lock:
            self.tracker.heartbeat(Heartbeat(front, time))

    def unregister_front(self, front: int, timeout_s: float = 30.0, *,
                         owner: str | None = None) -> None:
        with self.lock:
            self.tracker.unregister_front(UnregisterFront(front))

    def report_late(self, front: int, counts: tuple[int, int, int, int],
                    timeout_s: float = 10.0) -> None:
        self.late[front] = counts

    def flush(self, timeout_s: float = 30.0) -> None:
        """Every call was applied at once: nothing to wait for."""

    def close(self) -> None:
        """Nothing to close: no connection."""

    def on_update(self, callback: Callable[[Any], None],
                  segment: str | None = None) -> Callable[[], None]:
        """Pushes nothing: its readers ask (``min_time_at``, ``step``)."""
        return lambda: None

    def follow_graph(self, timeout_s: float = 10.0) -> SegmentGraph:
        """One graph generation: the core tracker's."""
        return self.graph

    def status(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The fronts (a successor resumes there) and the segments' min times (a clock
        front refused as behind starts there), as the service's status has them."""
        with self.lock:
            return {"fronts": {str(f): list(v) for f, v in self.tracker.fronts().items()},
                    "segments": [{"segment": n, "min_time": self.tracker.min_time(n)}
                                 for n in self.graph.names]}

    def step(self) -> dict[str | None, int]:
        with self.lock:
            self.tracker.step(0)
            out: dict[str | None, int] = {n: self.tracker.min_time(n) for n in self.graph.names}
            out[None] = self.tracker.min_time(None)
            return out


@dataclass
class Notified:
    time: int
    wall_ms: int
    snapshot: Any


@dataclass
class Watcher:
    """Consumes the sink's min time updates on a thread; for each one, records what
    ``snapshot()`` says the sink has committed at that moment."""

    agent: Any
    segment: str
    snapshot: Callable[[], Any]
    seen: list[Notified] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Watcher:
        sub = self.agent.subscribe(self.segment)

        def run() -> None:
            try:
                while not self._stop.is_set():
                    try:
                        u = sub.next_update(0.1)
                    except TimeoutError:
                        continue
                    snap = self.snapshot()
                    self.seen.append(Notified(u.time, time.time_ns() // 1_000_000, snap))
            finally:
                sub.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def latest(self) -> int:
        return self.seen[-1].time if self.seen else 0

    def wait_for(self, t: int, timeout_s: float, query: Any = None) -> None:
        deadline = time.monotonic() + timeout_s
        while self.latest() < t:
            if query is not None and query.exception() is not None:
                raise AssertionError(f"query failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.segment} stuck at {self.latest()}, waited for {t}")
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def gen_expected(spec: GeneratorSpec, t0: int, t: int, delta_ms: int) -> dict[int, int]:
    """front -> number of rows with slot < t (rows 0 .. n-1)."""
    return {f: rows_before(t0, spec.rate_of(f), t * delta_ms - 1) for f in spec.front_ids()}


def slowdown(ms: float) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
    def fn(b: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(ms / 1000)
        return b

    return fn


def keys_of(table: pa.Table, cols: list[str]) -> list[tuple[int, ...]]:
    arrays = [table[c].to_numpy() for c in cols]
    return list(zip(*(a.tolist() for a in arrays), strict=True))


def as_int(col: Any) -> np.ndarray:
    return np.asarray(pc.cast(col, pa.int64()).to_numpy())


def t0_of_checkpoint(ckpt: Path, query: Any, timeout_s: float = 60.0) -> int:
    """The generator's t0, from the first offsets Spark logged (a query of several
    sources logs a line for each; a window planned in the JVM adds its clock's)."""
    deadline = time.monotonic() + timeout_s
    first = ckpt / "offsets" / "0"
    while not first.exists():
        assert query.query.exception() is None, query.query.exception()
        assert time.monotonic() < deadline, "no batch logged"
        time.sleep(0.1)
    time.sleep(0.1)
    lines = first.read_text().strip().splitlines()
    return next(int(doc["t0"]) for doc in map(_json_or_none, lines) if doc and "t0" in doc)


def _json_or_none(line: str) -> Any:
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


class Committed:
    """A ``foreach_batch`` function that keeps every non-empty batch's rows (the
    generator's ``event_ms`` and ``payload`` left out)."""

    def __init__(self) -> None:
        self.frames: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.drop("event_ms", "payload").toPandas()
        with self._lock:
            if len(rows):  # an empty frame's columns are objects: they would change dtypes
                self.frames.append(rows)

    def rows(self) -> Any:
        """Every committed row, each at most once."""
        import pandas as pd

        got = pd.concat(self.frames, ignore_index=True)
        assert len(got) == len(got.drop_duplicates(["lt_ack", "lt_time"])), "a row twice"
        return got


def run_past_lag(pipe: Any, stream: Any, sink: Committed, ckpt: Path,
                 during: Callable[[Any], None] | None = None) -> tuple[int, int]:
    """Run ``stream`` into ``sink`` until the sink's min time is 150 slots past its
    first one (past a front lagging up to a second and a half), nothing stuck;
    ``during(query)`` runs once the first min time is announced. Returns the
    generator's t0 and the sink's final min time; the pipeline is closed."""
    query = watcher = None
    try:
        query = stream.foreach_batch(sink, checkpoint=str(ckpt), keep_tracking_columns=True,
                                     trigger="200 milliseconds")
        watcher = Watcher(pipe.tracker.agent, "sink", lambda: None).start()
        t0 = t0_of_checkpoint(ckpt, query)
        watcher.wait_for(1, 90, query.query)
        if during is not None:
            during(query)
        watcher.wait_for(watcher.latest() + 150, 90, query.query)
        assert not query.stuck()
        query.stop()
        return t0, query.min_time("sink")
    finally:
        if watcher is not None:
            watcher.stop()
        pipe.close()


def generated(spark: Any, spec: GeneratorSpec, t0: int, final: int, delta_ms: int) -> Any:
    """The generator's rows (front, seq) below slot ``final``, as a batch DataFrame."""
    import pandas as pd

    rows = [pd.DataFrame({"front": np.int32(f), "seq": np.arange(n, dtype=np.int64)})
            for f, n in gen_expected(spec, t0, final, delta_ms).items()]
    return spark.createDataFrame(pd.concat(rows, ignore_index=True))


def assert_equal_below(got: Any, expected: Any, final: int, order: list[str]) -> Any:
    """The committed rows below ``final`` equal ``expected`` (pandas), as text, in
    ``order``; returns them. How many rows a run reaches follows its machine's speed
    and its steps' filters, so only an empty (vacuous) comparison is refused."""
    import pandas as pd

    below = got[got["lt_time"] < final].drop(columns=["lt_time", "lt_ack"])
    assert list(below.columns) == list(expected.columns)
    a = below.sort_values(order).reset_index(drop=True)
    b = expected.sort_values(order).reset_index(drop=True)
    assert len(b) > 0, "no rows below the final time: nothing was compared"
    pd.testing.assert_frame_equal(a.astype(str), b.astype(str))
    return a


def parse_log_record(b: pa.RecordBatch) -> pa.RecordBatch:
    """An ingest log record as (front, offset, payload size): a map step's function."""
    return pa.record_batch({"front": b["front"], "offset": b["offset"],
                            "size": pc.binary_length(b["payload"])})


def published(out: Path) -> list[str]:
    """The Parquet files a file sink has published in ``out``."""
    return sorted(p.name for p in out.glob("part-*.parquet"))


def premature(seen: list[Notified], files: dict[str, Any],
              logged: dict[tuple[int, int], int]) -> list[str]:
    """Notifications ahead of the published files: a min time past a logged record
    (``(front, offset) -> time``) that no file published at that moment held."""
    out = []
    for n in seen:
        have: set[tuple[int, int]] = set()
        for name in n.snapshot:
            t = files[name]
            have.update(zip(t["front"].to_pylist(), t["offset"].to_pylist(), strict=True))
        early = [k for k, t in logged.items() if t < n.time and k not in have]
        if early:
            out.append(f"premature: t={n.time} before {early[:5]}")
    return out


def wait_batches(query: Any, n: int, timeout_s: float = 90) -> None:
    """Until Spark's ``query`` has run batch ``n`` (its exception raised if it failed)."""
    deadline = time.monotonic() + timeout_s
    while (query.lastProgress or {}).get("batchId", -1) < n:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"fewer than {n} batches"
        time.sleep(0.1)


def executed_plan(query: Any, timeout_s: float = 300.0) -> str:
    """The physical plan of ``query``'s last micro-batch, once it ran one."""
    deadline = time.monotonic() + timeout_s
    while query.lastProgress is None:
        assert time.monotonic() < deadline, f"no batch in {timeout_s:.0f} s"
        time.sleep(0.1)
    return str(query._jsq.streamingQuery().lastExecution().executedPlan().toString())
