"""``lowtide demo``: exact windows next to a watermark query, on the same event stream.

An embedded tracker and a local SparkSession. ``--fronts`` generator fronts, the last
one lagging by ``--lag-ms``; parse -> filter -> per-user 2-second windows -> Parquet,
tracked by lowtide. The same generator spec also feeds a plain Spark query:
``withWatermark(--watermark-ms)`` + ``groupBy(user, window(ts, "2 seconds"))`` ->
Parquet. (Each query's generator starts at its own t0; the events are the same
relative to it.) While they run, a live view shows each segment's min time, lag and
rows/s, the fronts, and windows as they close. At the end: a side-by-side table
(windows emitted, rows dropped as late, delay from window end to result) and both
queries' windows checked against a batch recomputation (Spark batch, same windows)
of their input; then one JSON line.

Delay = the result file's modification time minus the window's end (event time is
the wall clock at the front). Only windows ending after both queries are warm (their
second micro-batch done) count for delays.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

WINDOW = "2 seconds"
WINDOW_MS = 2_000
USERS = 8


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


def start_lowtide(spark: Any, spec: Any, out: str, ckpt: str) -> tuple[Any, Any]:
    from lowtide.core.time import TimeGrid
    from lowtide.spark.pipeline import Pipeline

    pipe = Pipeline(spark, "demo", grid=TimeGrid(10))
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


def start_watermark(spark: Any, spec: Any, out: str, ckpt: str, delay_ms: int) -> Any:
    from pyspark.sql import functions as F

    df = (spark.readStream.format("lowtide_gen").option("spec", spec.to_json())
          .option("tracking", "false").option("delta_ms", "10").load())
    windows = (plain_frame(df).withWatermark("ts", f"{delay_ms} milliseconds")
               .groupBy("user", F.window("ts", WINDOW))
               .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
               .select("user", F.col("window.start").alias("window_start"),
                       F.col("window.end").alias("window_end"), "n", "total"))
    return (windows.writeStream.format("parquet").outputMode("append")
            .option("path", out).option("checkpointLocation", ckpt)
            .trigger(processingTime="500 milliseconds").queryName("watermark").start())


# ------------------------------------------------------------------ results


def t0_of(ckpt: str) -> int | None:
    p = Path(ckpt) / "offsets" / "0"
    if not p.exists():
        return None
    try:
        return int(json.loads(p.read_text().strip().splitlines()[-1])["t0"])
    except (ValueError, KeyError, IndexError):
        return None


def read_windows(out: str) -> Any:
    """user, start_ms, end_ms, n, total, done_ms (file mtime) of every result row."""
    import pandas as pd
    import pyarrow.parquet as pq

    frames = []
    for f in sorted(glob.glob(os.path.join(out, "*.parquet"))):
        try:
            t = pq.read_table(f, columns=["user", "window_start", "window_end", "n", "total"])
        except Exception:  # a file being written
            continue
        df = t.to_pandas()
        df["done_ms"] = os.stat(f).st_mtime_ns // 1_000_000
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["user", "start_ms", "end_ms", "n", "total", "done_ms"])
    df = pd.concat(frames, ignore_index=True)
    epoch = pd.Timestamp(0, tz="UTC")
    for c in ("window_start", "window_end"):
        df[c.replace("window_", "") + "_ms"] = (
            (pd.to_datetime(df[c], utc=True) - epoch) // pd.Timedelta(1, "ms")).astype("int64")
    return df[["user", "start_ms", "end_ms", "n", "total", "done_ms"]]


def batch_recompute(spark: Any, spec: Any, t0: int, horizon_ms: int) -> Any:
    """Spark batch: the same parse, filter and windows over every event labelled
    before ``horizon_ms`` (the generator is deterministic)."""
    import pandas as pd
    from pyspark.sql import functions as F

    from lowtide.spark.generator import label_ms, rows_before

    parts = []
    for f in spec.front_ids():
        n = rows_before(t0, spec.rate_of(f), horizon_ms - 1)
        seq = np.arange(n, dtype=np.int64)
        parts.append(pd.DataFrame({"front": np.int32(f), "seq": seq,
                                   "event_ms": label_ms(t0, spec.rate_of(f), seq)}))
    pdf = pd.concat(parts, ignore_index=True)
    df = spark.createDataFrame(pdf, "front int, seq long, event_ms long")
    res = (plain_frame(df).groupBy("user", F.window("ts", WINDOW))
           .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
           .select("user", (F.unix_millis(F.col("window.start"))).alias("start_ms"),
                   (F.unix_millis(F.col("window.end"))).alias("end_ms"), "n", "total"))
    out = res.toPandas()
    return out[out["end_ms"] <= horizon_ms]


def compare(got: Any, batch: Any, complete_below_ms: int) -> dict[str, int]:
    """Emitted windows vs the batch: differing (wrong count or sum), duplicated,
    missing (complete below ``complete_below_ms`` but never emitted), rows lost."""
    exp = {(u, int(s)): (int(n), float(t)) for u, s, n, t in
           zip(batch["user"], batch["start_ms"], batch["n"], batch["total"], strict=True)}
    seen: set[tuple[str, int]] = set()
    differ = dup = lost = 0
    for u, s, n, t in zip(got["user"], got["start_ms"], got["n"], got["total"], strict=True):
        k = (u, int(s))
        if k in seen:
            dup += 1
        seen.add(k)
        e = exp.get(k)
        if e is None:
            continue  # beyond the horizon of the recomputation
        if e[0] != int(n) or not np.isclose(e[1], float(t)):
            differ += 1
            lost += e[0] - int(n)
    missing = sum(1 for (u, s) in exp if s + WINDOW_MS <= complete_below_ms
                  and (u, s) not in seen)
    return {"differ": differ, "duplicates": dup, "missing": missing, "rows_lost": lost}


def delays(got: Any, since_ms: int) -> tuple[int, float, float, float]:
    d = got[got["end_ms"] >= since_ms]
    if not len(d):
        return 0, float("nan"), float("nan"), float("nan")
    x = (d["done_ms"] - d["end_ms"]).to_numpy(np.float64)
    return len(d), float(x.mean()), float(np.percentile(x, 50)), float(np.percentile(x, 99))


def dropped_by_watermark(query: Any) -> int:
    total = 0
    for p in query.recentProgress:
        for op in p.get("stateOperators", []) or []:
            total += int(op.get("numRowsDroppedByWatermark", 0) or 0)
    return total


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
        fronts.add_row(str(f), f"{st.wall_ms - t * 10}{flag}")
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
    py = sys.executable
    os.environ.setdefault("PYSPARK_PYTHON", py)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", py)
    from pyspark.sql import SparkSession

    from lowtide.spark.windows import ROCKSDB

    spark = (SparkSession.builder.master(args.master).appName("lowtide-demo")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
             .config("spark.driver.extraJavaOptions", "-Xss32m").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        doc = run(spark, args)
    finally:
        spark.stop()
    return 0 if doc["matches_batch"] else 1


def run(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Run the demo on ``spark`` (left running); prints, and returns the JSON doc."""
    from lowtide.spark.generator import GeneratorSpec
    from lowtide.spark.pipeline import register_sources

    last = args.fronts - 1
    spec = GeneratorSpec(fronts=args.fronts, rate=args.rate, payload_bytes=8,
                         lag_ms={last: args.lag_ms} if args.lag_ms else {})

    register_sources(spark)
    tmp = args.dir or tempfile.mkdtemp(prefix="lowtide-demo-")
    d = {k: os.path.join(tmp, k) for k in ("lt_out", "lt_ckpt", "wm_out", "wm_ckpt")}
    say = (lambda *a: None) if args.json else print
    pipe = wm = lt = None
    try:
        pipe, lt = start_lowtide(spark, spec, d["lt_out"], d["lt_ckpt"])
        wm = start_watermark(spark, spec, d["wm_out"], d["wm_ckpt"], args.watermark_ms)
        say(f"tracker {pipe.tracker.url}; segments {list(lt.graph.names)}; outputs in {tmp}")
        say("warming up (the first micro-batches start Python workers) ...")
        deadline = time.monotonic() + 300
        while (len(lt.query.recentProgress) < 2 or len(wm.recentProgress) < 2):
            for q in (lt.query, wm):
                if q.exception() is not None:
                    raise RuntimeError(f"query failed: {q.exception()}")
            if time.monotonic() > deadline:
                raise RuntimeError("queries did not start within 300 s")
            time.sleep(0.5)
        warm_ms = time.time_ns() // 1_000_000
        end = time.monotonic() + args.seconds
        if args.json:
            while time.monotonic() < end:
                time.sleep(0.5)
        else:
            from rich.live import Live

            with Live(render(pipe, d["lt_out"], wm, args.watermark_ms), refresh_per_second=2,
                      transient=False) as live:
                while time.monotonic() < end:
                    time.sleep(1.0)
                    for q in (lt.query, wm):
                        if q.exception() is not None:
                            raise RuntimeError(f"query failed: {q.exception()}")
                    live.update(render(pipe, d["lt_out"], wm, args.watermark_ms))
            print()
        lt_horizon_ms = lt.min_time() * 10
        dropped_wm = dropped_by_watermark(wm)
        lt.stop()
        if wm.isActive:
            wm.stop()
        lt_got, wm_got = read_windows(d["lt_out"]), read_windows(d["wm_out"])
        lt_t0, wm_t0 = t0_of(d["lt_ckpt"]), t0_of(d["wm_ckpt"])
        assert lt_t0 is not None and wm_t0 is not None
        lt_h = max([lt_horizon_ms, *lt_got["end_ms"].tolist()])
        wm_h = max([warm_ms, *wm_got["end_ms"].tolist()])
        lt_cmp = compare(lt_got, batch_recompute(spark, spec, lt_t0, lt_h), lt_horizon_ms)
        # the watermark query emits a window once its watermark passes the end: all
        # windows up to its last emitted one are expected
        wm_last = int(wm_got["end_ms"].max()) if len(wm_got) else 0
        wm_cmp = compare(wm_got, batch_recompute(spark, spec, wm_t0, wm_h), wm_last)
        n_lt, mean_lt, p50_lt, p99_lt = delays(lt_got, warm_ms)
        n_wm, mean_wm, p50_wm, p99_wm = delays(wm_got, warm_ms)
    finally:
        if lt is not None:
            lt.stop()
        if wm is not None and wm.isActive:
            wm.stop()
        if pipe is not None:
            pipe.close()
        if args.dir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    matches = (lt_cmp["differ"] == 0 and lt_cmp["duplicates"] == 0 and lt_cmp["missing"] == 0)
    lt_late = lt_cmp["rows_lost"]
    if not args.json:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"lowtide vs withWatermark({args.watermark_ms} ms), front {last} "
                        f"lagging {args.lag_ms} ms, {WINDOW} windows")
        for c in ("", "lowtide", "watermark"):
            t.add_column(c, justify="right")
        rows = [
            ("windows emitted", len(lt_got), len(wm_got)),
            ("rows dropped as late (missing vs batch)", lt_late, wm_cmp["rows_lost"]),
            ("  Spark's numRowsDroppedByWatermark", "-", dropped_wm),
            ("windows differing from batch", lt_cmp["differ"], wm_cmp["differ"]),
            ("complete windows never emitted", lt_cmp["missing"], wm_cmp["missing"]),
            ("windows emitted twice", lt_cmp["duplicates"], wm_cmp["duplicates"]),
            ("windows ending after warm-up", n_lt, n_wm),
            ("delay window end -> result, mean ms", f"{mean_lt:.0f}", f"{mean_wm:.0f}"),
            ("delay p50 ms", f"{p50_lt:.0f}", f"{p50_wm:.0f}"),
            ("delay p99 ms", f"{p99_lt:.0f}", f"{p99_wm:.0f}"),
        ]
        for r in rows:
            t.add_row(*(str(x) for x in r))
        Console().print(t)
        print(f"lowtide matches the batch recomputation: {matches}")

    def side(n: int, late: int, p50: float, p99: float, cmp: dict[str, int]) -> dict[str, Any]:
        return {"windows": n, "late_dropped": late,
                "delay_p50_ms": None if np.isnan(p50) else round(p50, 1),
                "delay_p99_ms": None if np.isnan(p99) else round(p99, 1),
                "differ_from_batch": cmp["differ"]}

    doc = {"bench": "demo",
           "lowtide": side(len(lt_got), lt_late, p50_lt, p99_lt, lt_cmp),
           "watermark": side(len(wm_got), wm_cmp["rows_lost"], p50_wm, p99_wm, wm_cmp),
           "matches_batch": matches}
    print(json.dumps(doc), flush=True)
    return doc


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m lowtide.spark.demo",
                                     description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
