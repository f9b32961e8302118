"""What the Spark benchmarks share: their configuration, the SparkSession, the
generator spec, and measuring rows per second and per CPU second over whole batches."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from lowtide.bench.spark.cpu import PROCESSES, cpu_by_process
from lowtide.spark.pipeline import await_idle, last_batch_id
from lowtide.spark.sources import GeneratorSpec


@dataclass(frozen=True)
class BenchConfig:
    fronts: int = 2
    rows_per_batch: int = 100_000
    payload_bytes: int = 16
    stages: int = 3
    partitions: int = 2
    seconds: float = 10.0
    warmup_batches: int = 3
    #: a round counts only whole runs of at least this many micro-batches per side: a
    #: run that finishes fewer in ``seconds`` runs longer (up to 300 s, then fails)
    min_batches: int = 3
    rounds: int = 5
    master: str = "local[2]"
    #: measured against "untracked" in every round; see VARIANTS
    #: ``untracked-hash``: the untracked maps on a tracked repartition's physical plan,
    #: for the maps' same-plan ratio (``same_plan_cpu_ratio``)
    variants: tuple[str, ...] = ("tracked", "untracked-hash")
    freeze_gc: bool = True  # Pipeline(freeze_gc=...)
    keys: int = 8  # the speculative shape's distinct keys (users)
    sink: str = "null"  # the window shape's sinks: "null" (noop) or "parquet" (files)


def user_map(batch: Any) -> Any:
    """The benchmark's user function: a cheap vectorised column update."""
    import pyarrow as pa
    import pyarrow.compute as pc

    i = batch.schema.get_field_index("event_ms")
    return batch.set_column(i, pa.field("event_ms", pa.int64()), pc.add(batch.column(i), 1))


#: a run counts every batch's progress (``counted_progress``); Spark keeps 100 by
#: default, fewer than a long run of the window shape finishes
PROGRESS_KEPT = ("spark.sql.streaming.numRecentProgressUpdates", "100000")


def session(cfg: BenchConfig) -> Any:
    from lowtide.spark import SessionConfig

    return SessionConfig(
        master=cfg.master, app_name="lowtide-bench-spark", shuffle_partitions=cfg.partitions,
        # RR-100's plans (100 Python stages) overflow the default 1 GiB heap
        driver_memory="4g", ui=False,
        conf=(("spark.sql.execution.arrow.maxRecordsPerBatch", "20000"), PROGRESS_KEPT),
    ).build()


def _spec(cfg: BenchConfig) -> GeneratorSpec:
    per_front = max(1, cfg.rows_per_batch // cfg.fronts)
    # A full batch spans 50 ms of label time (5 slots): far more than the pipeline can
    # do in real time, so every batch is full, and every batch moves the heartbeats
    # (and the sink's min time) forward.
    return GeneratorSpec(fronts=cfg.fronts, rate=per_front * cfg.fronts * 20.0,
                         payload_bytes=cfg.payload_bytes, max_rows_per_batch=per_front)


CPU: dict[str, float] = {}
#: the last measured run's CPU seconds by process (:func:`cpu_by_process`)
BY_PROCESS: dict[str, float] = {}


def _next_batch(query: Any, after: int, deadline: float, why: str = "") -> int:
    """Wait until a batch with id > ``after`` has completed; its id."""
    while True:
        done = last_batch_id(query)
        if done > after:
            return done
        if query.exception() is not None:
            raise RuntimeError(f"benchmark query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError(why or "benchmark query made no progress in 300 s")
        time.sleep(0.01)


class Measured(NamedTuple):
    """Whole batches after warm-up: the ids ``first < id <= last``."""

    rows: int
    secs: float  # batch time
    batches: int
    first: int
    last: int
    dropped: int = 0  # input rows the query's state operators dropped as late


    def counts(self, batch: int) -> bool:
        return self.first < batch <= self.last


def _measure(query: Any, cfg: BenchConfig) -> Measured:
    """Rows, seconds of batch time and batches over whole batches after warm-up. The CPU
    window runs from one batch's end to a later batch's end (triggers run back to
    back), so the CPU seconds in ``CPU["last"]`` are those of exactly the ``CPU["rows"]``
    rows counted: no partial batch at either end."""
    deadline = time.monotonic() + 300
    warm = _next_batch(query, cfg.warmup_batches - 2, deadline)
    first = _next_batch(query, warm, deadline)
    cpu0 = cpu_by_process()
    time.sleep(cfg.seconds)
    last = _next_batch(query, last_batch_id(query), deadline)
    while last - first < cfg.min_batches:  # too few to count: run longer
        why = (f"the query finished {last - first} micro-batches after warm-up in 300 s, "
               f"fewer than {cfg.min_batches}: no ratio from this run")
        last = _next_batch(query, last, deadline, why)
    by = cpu_by_process().since(cpu0)
    BY_PROCESS.clear()
    BY_PROCESS.update(by)
    CPU["last"] = sum(BY_PROCESS.values())
    progress = counted_progress(query.recentProgress, first, last)
    rows = sum(int(p["numInputRows"]) for p in progress)
    CPU["rows"] = float(rows)
    ms = sum(int(p["durationMs"].get("triggerExecution", 0)) for p in progress)
    return Measured(rows, ms / 1000.0, len(progress), first, last, dropped_late(progress))


def counted_progress(progress: list[Any], first: int, last: int) -> list[Any]:
    """The progress of every batch ``first < id <= last``: the CPU was measured over
    all of them, so a missing one (Spark keeps the last
    ``spark.sql.streaming.numRecentProgressUpdates``) would count their CPU against
    fewer rows. Raises instead.

    >>> counted_progress([{"batchId": b} for b in range(2, 6)], 2, 5)
    [{'batchId': 3}, {'batchId': 4}, {'batchId': 5}]
    >>> counted_progress([{"batchId": b} for b in range(4, 6)], 2, 5)
    Traceback (most recent call last):
    ...
    RuntimeError: the query kept the progress of 2 of the 3 micro-batches measured (3 to 5): no ratio from this run; raise spark.sql.streaming.numRecentProgressUpdates
    """  # noqa: E501
    kept = [p for p in progress if first < p["batchId"] <= last]
    if len(kept) != last - first:
        raise RuntimeError(
            f"the query kept the progress of {len(kept)} of the {last - first} micro-batches "
            f"measured ({first + 1} to {last}): no ratio from this run; raise "
            f"{PROGRESS_KEPT[0]}")
    return kept


def dropped_late(progress: list[Any]) -> int:
    """Input rows dropped by a watermark, summed over ``progress`` (Spark's
    ``stateOperators[].numRowsDroppedByWatermark``)."""
    return sum(int(op.get("numRowsDroppedByWatermark", 0)) for p in progress
               for op in p.get("stateOperators", []) or [])


class FullCollections:
    """The durations of this process's full (generation 2) garbage collections: the
    embedded tracker's thread stops during them, with the rest of the driver."""

    def __init__(self) -> None:
        self.ms: list[float] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.ms.append((time.perf_counter() - self._start) * 1e3)


FULL_GCS = FullCollections()


@dataclass
class _ByProcess:
    """One side's CPU seconds by process and rows, summed over counted runs."""

    cpu_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PROCESSES, 0.0))
    rows: float = 0.0

    def add(self, by: dict[str, float], rows: float) -> None:
        for k in PROCESSES:
            self.cpu_s[k] += by.get(k, 0.0)
        self.rows += rows

    def us_per_row(self) -> dict[str, float]:
        return {k: round(v * 1e6 / max(self.rows, 1.0), 3) for k, v in self.cpu_s.items()}

    def rows_per_cpu_s_without_jit(self) -> float:
        """Rows per CPU second of everything but the JVM's compiler threads."""
        return self.rows / max(sum(self.cpu_s.values()) - self.cpu_s["JVM compiler"], 1e-9)


def without_jit_ratio(side: _ByProcess, base: _ByProcess) -> float:
    """``side``'s CPU ratio to ``base`` leaving out the JIT compiler: both run in one
    JVM, and it compiles what either side warmed whenever it gets to it, whichever
    run that is (1.3 against 0.7 us per row in two runs of a minute)."""
    if not base.rows or not side.rows:
        return float("nan")
    return round(side.rows_per_cpu_s_without_jit() / base.rows_per_cpu_s_without_jit(), 4)


@dataclass
class _Tally:
    """One variant's counted runs."""

    rows: int = 0
    secs: float = 0.0
    batches: int = 0
    cpu_rows: float = 0.0
    cpu_s: float = 0.0
    ratios: list[float] = field(default_factory=list)  # wall, per round, vs untracked
    cpu_ratios: list[float] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)  # batches counted for throughput
    slowest: tuple[float, str] = (0.0, "")  # the largest counted delay: which run and batch
    #: the other batches with rows: each query's warm-up, and those run while it stops
    uncounted: list[tuple[float, str]] = field(default_factory=list)
    full_gcs_ms: list[float] = field(default_factory=list)  # the driver's, during counted runs
    by_process: _ByProcess = field(default_factory=_ByProcess)

    def add_delays(self, m: Measured, delays: dict[int, float], run: str) -> None:
        for batch, ms in delays.items():
            where = f"{run}, batch {batch}"
            if m.counts(batch):
                self.delays.append(ms)
                self.slowest = max(self.slowest, (ms, where))
            else:
                phase = "warm-up" if batch <= m.first else "stopping"
                self.uncounted.append((ms, f"{where}, {phase}"))

    def rate(self) -> float:
        return self.rows / max(self.secs, 1e-9)

    def cpu_rate(self) -> float:
        return self.cpu_rows / max(self.cpu_s, 1e-9)


def round_order(sides: tuple[str, ...], r: int) -> tuple[str, ...]:
    """The order the sides run in round ``r``: rotated each round, so that none always
    runs first (the JIT compiling shared code, garbage another run left) or last.

    >>> round_order(("a", "b"), 0), round_order(("a", "b"), 1), round_order(("a", "b", "c"), 4)
    (('a', 'b'), ('b', 'a'), ('b', 'c', 'a'))
    """
    k = r % len(sides)
    return sides[k:] + sides[:k]


def _summary(t: _Tally, base: _Tally) -> dict[str, Any]:
    return {
        # median of the per-round ratios: robust to load that drifts between rounds
        "throughput_ratio": round(float(np.median(t.ratios)), 4) if t.ratios else float("nan"),
        "pooled_ratio": round(t.rate() / base.rate(), 4) if base.rows else float("nan"),
        "round_ratios": [round(r, 3) for r in t.ratios],
        "cpu_ratio": round(t.cpu_rate() / base.cpu_rate(), 4) if base.cpu_s else float("nan"),
        "round_cpu_ratios": [round(r, 3) for r in t.cpu_ratios],
        "cpu_ratio_without_jit": without_jit_ratio(t.by_process, base.by_process),
        "rows_per_s": round(t.rate(), 1),
        "rows_per_cpu_s": round(t.cpu_rate(), 1),
        "us_per_row_by_process": t.by_process.us_per_row(),
    }




def stop_wait_s(query: Any) -> float:
    """How long a bench's stop waits for the running batch to end: twice its longest
    recent batch, at least 10 s. A stop inside a batch aborts its write (Spark's ERROR
    line ``WriteToDataSourceV2Exec ... is aborting``): Spark's join took about 17 s per
    batch of 150,000 rows."""
    longest_ms = max((int(p["durationMs"].get("triggerExecution", 0))
                      for p in query.recentProgress), default=0)
    return max(10.0, 2 * longest_ms / 1000.0)


def measure_query(query: Any, cfg: BenchConfig) -> Measured:
    """:func:`_measure` a plain Spark query, then stop it between batches."""
    from lowtide.spark.pipeline import stop_between_batches

    try:
        return _measure(query, cfg)
    finally:
        stop_between_batches(query, stop_wait_s(query))


def measure_pipeline(pipe: Any, stream: Any, cfg: BenchConfig, workdir: str,
                     start: Callable[[Any, str], Any] | None = None) -> Measured:
    """:func:`_measure` ``stream`` of ``pipe`` written to the tracked null sink (or
    ``start(stream, checkpoint)``'s sink), then stop it and close the pipeline."""
    try:
        ckpt = tempfile.mkdtemp(dir=workdir)
        query = stream.to_null(checkpoint=ckpt) if start is None else start(stream, ckpt)
        try:
            return _measure(query.query, cfg)
        finally:
            query.stop(graceful_s=stop_wait_s(query.query))
    finally:
        pipe.close()


Runner = Callable[[Any, BenchConfig, str], Measured]


def versus(cfg: BenchConfig, shape: str, spark_side: tuple[str, Runner],
           lowtide_side: tuple[str, Runner]) -> dict[str, Any]:
    """Spark's own query against lowtide's on the same shape, in one SparkSession
    (RocksDB state store): rounds alternate the two, which one runs first too
    (:func:`round_order`); the first round warms up and is not counted. Throughput:
    input rows per second of batch time after warm-up; CPU: rows per CPU second of the
    process tree; the ratios are lowtide / Spark, medians over the counted rounds."""
    from lowtide.spark.operators import ROCKSDB
    from lowtide.spark.pipeline import register_sources

    workdir = tempfile.mkdtemp(prefix=f"lowtide-bench-{shape}-")
    spark = session(cfg)
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    register_sources(spark)
    rates: dict[str, list[tuple[float, float]]] = {"spark": [], "lowtide": []}
    dropped = {"spark": 0, "lowtide": 0}
    by_process = {"spark": _ByProcess(), "lowtide": _ByProcess()}
    try:
        runners = {"spark": spark_side[1], "lowtide": lowtide_side[1]}
        for r in range(cfg.rounds):
            for name in round_order(("spark", "lowtide"), r):
                m = runners[name](spark, cfg, workdir)
                rate, cpu_rate = m.rows / max(m.secs, 1e-9), CPU["rows"] / max(CPU["last"], 1e-9)
                counted = r > 0 or cfg.rounds == 1
                if counted:
                    rates[name].append((rate, cpu_rate))
                    dropped[name] += m.dropped
                    by_process[name].add(BY_PROCESS, CPU["rows"])
                note = "" if counted else "  (warm-up, not counted)"
                print(f"round {r + 1} {name:>8}: {rate:>10,.0f} rows/s {cpu_rate:>9,.0f} rows"
                      f" per CPU s  ({m.batches} batches, {m.rows:,} rows, {m.dropped:,}"
                      f" dropped as late){note}", flush=True)
    finally:
        await_idle()
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    sp, lt = np.array(rates["spark"]), np.array(rates["lowtide"])
    ratios = lt / sp
    return {
        "bench": "spark", "shape": shape,
        "throughput_ratio": round(float(np.median(ratios[:, 0])), 4),
        "cpu_ratio": round(float(np.median(ratios[:, 1])), 4),
        "round_ratios": [round(float(x), 3) for x in ratios[:, 0]],
        "round_cpu_ratios": [round(float(x), 3) for x in ratios[:, 1]],
        "cpu_ratio_without_jit": without_jit_ratio(by_process["lowtide"], by_process["spark"]),
        "rows_per_s_lowtide": round(float(lt[:, 0].mean()), 1),
        "rows_per_s_spark": round(float(sp[:, 0].mean()), 1),
        "rows_per_cpu_s_lowtide": round(float(lt[:, 1].mean()), 1),
        "rows_per_cpu_s_spark": round(float(sp[:, 1].mean()), 1),
        "queries": [spark_side[0], lowtide_side[0]],
        "min_batches": cfg.min_batches,
        # rows dropped by a watermark in the counted rounds (lowtide has none to drop)
        "spark_dropped_late": dropped["spark"],
        "lowtide_dropped_late": dropped["lowtide"],
        # CPU microseconds per input row by process, over the counted rounds
        "us_per_row_by_process": {k: v.us_per_row() for k, v in by_process.items()},
    }


def report_versus(result: dict[str, Any]) -> None:
    """The human table of :func:`versus`; the caller prints the JSON line last."""
    spark_q, lowtide_q = result["queries"]
    width = max(26, len(spark_q), len(lowtide_q))
    print(f"{'query':<{width}} {'rows/s':>10} {'rows/CPU s':>11}")
    print(f"{spark_q:<{width}} {result['rows_per_s_spark']:>10,.0f}"
          f" {result['rows_per_cpu_s_spark']:>11,.0f}")
    print(f"{lowtide_q:<{width}} {result['rows_per_s_lowtide']:>10,.0f}"
          f" {result['rows_per_cpu_s_lowtide']:>11,.0f}")
    print(f"lowtide / Spark: throughput {result['throughput_ratio']:.3f} (rounds "
          f"{result['round_ratios']}), CPU {result['cpu_ratio']:.3f} (rounds "
          f"{result['round_cpu_ratios']}); medians over the counted rounds, each run "
          f"at least {result.get('min_batches', 1)} micro-batches after warm-up; CPU "
          f"without the JIT compiler {result.get('cpu_ratio_without_jit', float('nan')):.3f}"
          " (over the counted rounds)")
    by = result.get("us_per_row_by_process")
    if by:
        print(f"{'CPU us per input row':<{width}} " + " ".join(f"{k:>14}" for k in PROCESSES))
        for side, q in (("spark", spark_q), ("lowtide", lowtide_q)):
            print(f"{q:<{width}} " + " ".join(f"{by[side][k]:>14.3f}" for k in PROCESSES))
    if "spark_dropped_late" in result:
        print(f"rows dropped as late (counted rounds): Spark {result['spark_dropped_late']:,}"
              f" (its watermark), lowtide {result['lowtide_dropped_late']:,}")
