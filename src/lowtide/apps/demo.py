"""``lowtide demo``: exact windows next to a watermark query, on the same event stream.

An embedded tracker and a local SparkSession. ``--fronts`` generator fronts, the last
one lagging by ``--lag-ms``; parse -> filter -> per-user 2-second windows -> Parquet,
tracked by lowtide. The same generator spec also feeds a plain Spark query:
``withWatermark(--watermark-ms)`` + ``groupBy(user, window(ts, "2 seconds"))`` ->
Parquet. Both generators, and the batch recomputation, share one spec with one t0:
they serve the same events (front, seq, time, payload) on the same wall-clock
schedule. While they run, a live view shows each segment's min time, lag and
rows/s, the fronts, and windows as they close. At the end: a side-by-side table
(windows emitted, rows dropped as late, delay from window end to result) and both
queries' windows checked against one batch recomputation (Spark batch, same windows)
of those events; then one JSON line.

Delay = the result file's modification time minus the window's end (event time is
the wall clock at the front); ``lag_ms`` (the lagging front's lag) beside it: no exact
result can come earlier than the lag plus one micro-batch. Only windows ending after
both queries are warm (their second micro-batch done) count for delays.
``first_window_s``: from the command's start to lowtide's first result file (session
start, first micro-batches); each query's own beside its delays;
``first_window_floor_s``: when the data alone lets it close (the end of the first
window after ``t0``, plus the lag), two micro-batches before it can come out. Where the time goes
(:mod:`lowtide.apps.demo_batches`): ``session_s``, each query's ``startup`` phases,
``batch_p50_ms`` and ``phases_p50_ms`` (Spark's ``durationMs`` of a micro-batch, phase
by phase, the median once warm), and lowtide's ``batches_after_input_p50`` and ``_max``
over every window (0: a window comes out in the micro-batch that read its last rows).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.apps.demo_batches import (
    batch_p50_ms,
    batch_times,
    batches_after_input,
    emitted_in,
    offsets_doc,
    phases_p50_ms,
    startup,
)
from lowtide.apps.demo_cpu import TreeCpu, per_batch_ms
from lowtide.apps.demo_report import (
    compare,
    dropped_by_watermark,
    first_window_floor_s,
    first_window_s,
    judged_to_ms,
    matches_batch,
    print_table,
    read_windows,
    side,
)
from lowtide.apps.startup import (
    QueryFailed,
    WorkerStartFailed,
    make_session,
    prepare,
    raise_if_failed,
    wait_warm,
)
from lowtide.service import wall_ms

WINDOW = "2 seconds"
WINDOW_MS = 2_000
USERS = 8
START_ATTEMPTS = 3
OUTPUTS = ("lt_out", "lt_ckpt", "wm_out", "wm_ckpt")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=30.0, help="run time once warm")
    p.add_argument("--fronts", type=int, default=4)
    p.add_argument("--rate", type=float, default=400.0, help="rows/s over all fronts")
    p.add_argument("--lag-ms", type=int, default=5_000, help="the last front lags this much")
    p.add_argument("--watermark-ms", type=int, default=1_000,
                   help="the watermark query's withWatermark delay")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--json", action="store_true", help="only the final JSON line")
    p.add_argument("--dir", help="keep outputs here (default: a temporary directory)")
    from lowtide.apps import demo_input  # --input: the same comparison on the user's data

    demo_input.add_arguments(p)


def demo_spec(fronts: int, rate: float, lag_ms: int, t0_ms: int, tasks: int = 0) -> Any:
    """``fronts`` generator fronts from ``t0_ms``, the last one lagging ``lag_ms``, read
    by ``tasks`` tasks a micro-batch (0: one per front)."""
    from lowtide.spark.sources import GeneratorSpec

    return GeneratorSpec(fronts=fronts, rate=rate, payload_bytes=8,
                         lag_ms={fronts - 1: lag_ms} if lag_ms else {}, t0_ms=t0_ms,
                         tasks=tasks)


# ------------------------------------------------------------------ the pipelines


def parse(b: Any) -> Any:
    """Arrow batch -> user, amount (what both queries compute)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    seq = b["seq"]
    user_no = pc.bit_wise_and(pc.add(seq, pc.cast(b["front"], pa.int64())), USERS - 1)
    user = pc.binary_join_element_wise("u", pc.cast(user_no, pa.string()), "")
    amount = pc.cast(pc.bit_wise_and(pc.multiply(seq, 7), 127), pa.float64())
    return pa.record_batch({"user": user, "amount": amount})


def keep(b: Any) -> Any:
    import pyarrow.compute as pc

    return pc.greater(b["amount"], 3.0)


def start_lowtide(spark: Any, spec: Any, out: str, ckpt: str,
                  tracker: str | None = None) -> tuple[Any, Any]:
    """The tracked pipeline; ``tracker``: a ``lowtide serve`` URL (default: embedded)."""
    from lowtide.core.time import TimeGrid
    from lowtide.spark.pipeline import Pipeline

    # stuck: open longer than any first micro-batch (its rows are in flight until it ends)
    pipe = Pipeline(spark, "demo", grid=TimeGrid(10), stuck_after_ms=120_000, tracker=tracker)
    stream = (pipe.generate(spec)
              .map(parse, "user string, amount double", name="parse")
              .filter(keep, name="filter")
              .window(WINDOW, key="user", name="window")
              .agg(n="count", total=("amount", "sum")))
    query = stream.write_parquet(out, checkpoint=ckpt, trigger="500 milliseconds",
                                 query_name="lowtide")
    return pipe, query


def plain_frame(df: Any) -> Any:
    """The same parse and filter in Spark SQL (no tracking)."""
    from pyspark.sql import functions as F

    user_no = F.expr(f"(seq + front) & {USERS - 1}")
    return (df.select(F.concat(F.lit("u"), user_no.cast("string")).alias("user"),
                      F.expr("cast((seq * 7) & 127 as double)").alias("amount"),
                      F.timestamp_millis("event_ms").alias("ts"))
            .where("amount > 3"))


def start_watermark(spark: Any, spec: Any, out: str, ckpt: str, delay_ms: int,
                    name: str = "watermark", frame: Callable[[Any], Any] = plain_frame,
                    key: str = "user", summed: str = "amount", trigger_ms: int = 500) -> Any:
    """The plain Spark query: ``frame`` (the generator's rows -> ``key``, ``summed``
    and ``ts``), windows of ``key`` closed by ``withWatermark(delay_ms)``, a
    micro-batch every ``trigger_ms``."""
    from pyspark.sql import functions as F

    from lowtide.spark.sources import UNTRACKED_SCHEMA

    df = (spark.readStream.format("lowtide_gen").option("spec", spec.to_json())
          .option("tracking", "false").option("delta_ms", "10").schema(UNTRACKED_SCHEMA)
          .load())  # the schema given, as lowtide's query does: no Python call for it
    windows = (frame(df).withWatermark("ts", f"{delay_ms} milliseconds")
               .groupBy(key, F.window("ts", WINDOW))
               .agg(F.count("*").alias("n"), F.sum(summed).alias("total"))
               .select(key, F.col("window.start").alias("window_start"),
                       F.col("window.end").alias("window_end"), "n", "total"))
    return (windows.writeStream.format("parquet").outputMode("append")
            .option("path", out).option("checkpointLocation", ckpt)
            .trigger(processingTime=f"{trigger_ms} milliseconds").queryName(name).start())


# ------------------------------------------------------------------ results


def served(ckpt: str) -> tuple[int, dict[int, int]] | None:
    """(t0, front -> rows served) of a generator query's last committed micro-batch,
    from its checkpoint: what the query read."""
    done = [int(p.name) for p in (Path(ckpt) / "commits").glob("[0-9]*")]
    if not done:
        return None
    text = (Path(ckpt) / "offsets" / str(max(done))).read_text()
    # one line per source: a window planned in the JVM adds its clock's
    off = next(doc for doc in map(offsets_doc, text.strip().splitlines()) if "t0" in doc)
    return int(off["t0"]), {int(k[1:]): int(v["seq"]) for k, v in off.items() if k[0] == "f"}


def events(spec: Any, t0: int, rows: dict[int, int]) -> Any:
    """front, seq, event_ms of rows 0 .. rows[front] - 1 of each front from ``t0``."""
    import pandas as pd

    from lowtide.spark.sources import label_ms

    parts = [pd.DataFrame({"front": np.int32(f), "seq": seq,
                           "event_ms": label_ms(t0, spec.rate_of(f), seq)})
             for f, n in sorted(rows.items()) for seq in [np.arange(n, dtype=np.int64)]]
    return pd.concat(parts, ignore_index=True)


def batch_events(spec: Any, horizon_ms: int) -> Any:
    """Every event of ``spec`` labelled before ``horizon_ms``."""
    from lowtide.spark.sources import rows_before

    return events(spec, spec.t0_ms, {f: rows_before(spec.t0_ms, spec.rate_of(f), horizon_ms - 1)
                                     for f in spec.front_ids()})


def batch_recompute(spark: Any, spec: Any, horizon_ms: int) -> Any:
    """Spark batch: the same parse, filter and windows over every event labelled
    before ``horizon_ms`` (the generator is deterministic)."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(batch_events(spec, horizon_ms), "front int, seq long, event_ms long")
    res = (plain_frame(df).groupBy("user", F.window("ts", WINDOW))
           .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
           .select("user", (F.unix_millis(F.col("window.start"))).alias("start_ms"),
                   (F.unix_millis(F.col("window.end"))).alias("end_ms"), "n", "total"))
    out = res.toPandas()
    return out[out["end_ms"] <= horizon_ms]


# ------------------------------------------------------------------ live view


def render(pipe: Any, lt_out: str, wm_query: Any, delay_ms: int) -> Any:
    from rich.console import Group
    from rich.table import Table

    st = pipe.status()
    seg = Table(title="lowtide segments (min time: nothing older is still in flight)")
    for c in ("segment", "min time (slot)", "lag ms", "rows/s", "in flight"):
        seg.add_column(c, justify="right" if c != "segment" else "left")
    for s in st.segments:
        seg.add_row(s.segment, str(s.min_time), "-" if s.lag_ms is None else str(s.lag_ms),
                    "-" if s.rows_per_s is None else f"{s.rows_per_s:.0f}",
                    "-" if s.in_flight is None else str(s.in_flight))
    fronts = Table(title="fronts")
    fronts.add_column("front")
    fronts.add_column("heartbeat lag ms", justify="right")
    for f, (_seg, t) in sorted(st.fronts.items(), key=lambda kv: int(kv[0])):
        flag = " (stalled)" if int(f) in st.stalled_fronts else ""
        fronts.add_row(str(f), f"{st.wall_ms - pipe.grid.slot_start_ms(t)}{flag}")
    wins = Table(title="windows closed (lowtide, latest)")
    for c in ("user", "window end", "n", "total", "delay ms"):
        wins.add_column(c, justify="right")
    got = read_windows(lt_out)
    for _, r in got.sort_values(["end_ms", "user"]).tail(6).iterrows():
        wins.add_row(r["user"], time.strftime("%H:%M:%S", time.gmtime(r["end_ms"] / 1000)),
                     str(int(r["n"])), f"{r['total']:.0f}", str(int(r["done_ms"] - r["end_ms"])))
    wm = wm_query.lastProgress or {}
    wm_line = (f"watermark query (delay {delay_ms} ms): watermark "
               f"{(wm.get('eventTime') or {}).get('watermark', '-')}, rows dropped as late "
               f"{dropped_by_watermark(wm_query)}")
    return Group(seg, fronts, wins, wm_line)


# ------------------------------------------------------------------ main


def main(args: argparse.Namespace) -> int:
    try:
        if getattr(args, "input", None):
            from lowtide.apps import demo_input

            return demo_input.main(args)
        started_ms = wall_ms()
        # Python workers start while the queries are planned
        spark = make_session(args.master, "lowtide-demo", prewarm_workers=2)
        try:
            doc = run_started(spark, args, started_ms)
        finally:
            spark.stop()
    except QueryFailed as failed:  # one line, not Spark's and Python's stack traces
        print(f"lowtide demo: {failed}", file=sys.stderr)
        return 1
    return 0 if doc["matches_batch"] else 1


def run_started(spark: Any, args: argparse.Namespace, started_ms: int) -> dict[str, Any]:
    """:func:`run`, started again (fresh outputs) when a Python worker did not connect
    back in time: on a loaded machine the next start usually makes it."""
    for attempt in range(1, START_ATTEMPTS):
        try:
            return run(spark, args, started_ms)
        except WorkerStartFailed as failed:
            if not args.json:
                print(f"{failed}; starting again ({attempt + 1} of {START_ATTEMPTS})")
            for name in OUTPUTS if args.dir else ():
                shutil.rmtree(os.path.join(args.dir, name), ignore_errors=True)
    return run(spark, args, started_ms)


def watch(args: argparse.Namespace, pipe: Any, lt: Any, wm: Any, lt_out: str) -> None:
    """Let both queries run ``args.seconds``, with the live view unless ``--json``."""
    end = time.monotonic() + args.seconds
    if args.json:
        while time.monotonic() < end:
            raise_if_failed([lt.query, wm])
            time.sleep(0.5)
        return
    from rich.live import Live

    with Live(render(pipe, lt_out, wm, args.watermark_ms), refresh_per_second=2,
              transient=False) as live:
        while time.monotonic() < end:
            time.sleep(1.0)
            raise_if_failed([lt.query, wm])
            live.update(render(pipe, lt_out, wm, args.watermark_ms))
    print()


def progress_of(query: Any) -> list[dict[str, Any]]:
    """A query's recent micro-batches: each one's id and phases (ms)."""
    return [{"batchId": p.batchId, "durationMs": dict(p.durationMs)}
            for p in query.recentProgress]


def run(spark: Any, args: argparse.Namespace, started_ms: int | None = None) -> dict[str, Any]:
    """Run the demo on ``spark`` (left running); prints, and returns the JSON doc.
    ``started_ms``: when the command started (default: now)."""
    started_ms = started_ms or wall_ms()
    session_s = round((wall_ms() - started_ms) / 1000, 1)  # the session is up
    from lowtide.spark.pipeline import stop_between_batches

    # a source task per core, not per front: a micro-batch's fixed cost (BENCHMARKS.md)
    spec = demo_spec(args.fronts, args.rate, args.lag_ms, wall_ms(),
                     spark.sparkContext.defaultParallelism)
    prepare(spark)
    tmp = args.dir or tempfile.mkdtemp(prefix="lowtide-demo-")
    d = {k: os.path.join(tmp, k) for k in OUTPUTS}
    say = (lambda *a: None) if args.json else print
    pipe = wm = lt = None
    cpu = TreeCpu().start()
    try:
        pipe, lt = start_lowtide(spark, spec, d["lt_out"], d["lt_ckpt"])
        wm = start_watermark(spark, spec, d["wm_out"], d["wm_ckpt"], args.watermark_ms)
        say(f"tracker {pipe.tracker.url}; segments {list(lt.graph.names)}; outputs in {tmp}")
        say("warming up (the first micro-batches start Python workers) ...")
        warm_ms = wait_warm([lt.query, wm], say=say)
        cpu_warm = cpu.by_kind()
        watch(args, pipe, lt, wm, d["lt_out"])
        cpu_end, end_ms = cpu.by_kind(), wall_ms()
        lt_horizon_ms = pipe.grid.slot_start_ms(lt.min_time())
        dropped_wm = dropped_by_watermark(wm)
        lt.stop()
        stop_between_batches(wm)
        # after the stops: a batch under way when the run ended counts too
        phases = {k: phases_p50_ms(progress_of(q))
                  for k, q in (("lt_ckpt", lt.query), ("wm_ckpt", wm))}
        lt_got, wm_got = read_windows(d["lt_out"]), read_windows(d["wm_out"])
        same = all((served(d[k]) or (None,))[0] == spec.t0_ms for k in ("lt_ckpt", "wm_ckpt"))
        horizon_ms = max(judged_to_ms(lt_got, lt_horizon_ms), judged_to_ms(wm_got, warm_ms))
        batch = batch_recompute(spark, spec, horizon_ms)
        lt_cmp = compare(lt_got, batch, judged_to_ms(lt_got, lt_horizon_ms))
        wm_cmp = compare(wm_got, batch, judged_to_ms(wm_got))
        batches = {k: batch_times(d[k]) for k in ("lt_ckpt", "wm_ckpt")}
        # every window, the first ones too: how many batches after its last rows it came
        after_input = batches_after_input(batches["lt_ckpt"], emitted_in(d["lt_out"]), 0)
        startups = {k: startup(batches[k], d[k], started_ms) for k in batches}
    finally:
        cpu.stop()
        if lt is not None:
            lt.stop()
        if wm is not None and wm.isActive:
            wm.stop()
        if pipe is not None:
            pipe.close()
        if args.dir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    lt_side, wm_side = side(lt_got, lt_cmp, warm_ms), side(wm_got, wm_cmp, warm_ms)
    lt_side["lag_ms"] = wm_side["lag_ms"] = args.lag_ms  # the physical limit: lag + a batch
    for q, k in ((lt_side, "lt_ckpt"), (wm_side, "wm_ckpt")):  # where the time goes
        q["batch_p50_ms"] = batch_p50_ms(batches[k], warm_ms)
        q["phases_p50_ms"] = phases[k]
        q["startup"] = startups[k]
    lt_side["batches_after_input_p50"] = (float(np.median(after_input)) if after_input
                                          else None)
    lt_side["batches_after_input_max"] = max(after_input, default=None)
    lt_side["first_window_s"] = first_s = first_window_s(lt_got, started_ms)
    wm_side["first_window_s"] = first_window_s(wm_got, started_ms)
    matches = matches_batch(lt_cmp)
    warm_batches = sum(warm_ms <= (t["commit_ms"] or 0) <= end_ms
                       for times in batches.values() for t in times.values())
    if not args.json:
        print_table(args, WINDOW, lt_side, wm_side, lt_cmp, wm_cmp, dropped_wm)
        print(f"lowtide matches the batch recomputation: {matches}")
    doc = {"bench": "demo", "lowtide": lt_side, "watermark": wm_side, "matches_batch": matches,
           "same_events": same, "t0_ms": spec.t0_ms, "first_window_s": first_s,
           "lag_ms": args.lag_ms, "session_s": session_s,
           "cpu_ms_per_batch": per_batch_ms(cpu_warm, cpu_end, warm_batches),
           "first_window_floor_s": first_window_floor_s(spec.t0_ms, WINDOW_MS, args.lag_ms,
                                                        started_ms)}
    print(json.dumps(doc), flush=True)
    return doc


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m lowtide.apps.demo",
                                     description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
