"""What the demos report (``lowtide demo``, ``lowtide demo --input``, the cluster job and
``lowtide bench sweep``): the windows a query wrote, judged against a batch
recomputation, their delays, the rows Spark dropped as late, and the side-by-side
table."""

from __future__ import annotations

import argparse
import glob
import json
import os
from pathlib import Path
from typing import Any

import numpy as np


def committed(out: str) -> set[str] | None:
    """Names of the files a Spark file sink committed (its ``_spark_metadata`` log);
    None for a sink without that log (lowtide's sink publishes files at commit)."""
    log = Path(out) / "_spark_metadata"
    if not log.is_dir():
        return None
    names = set()
    for f in log.iterdir():
        if f.name.startswith("."):
            continue
        for line in f.read_text().splitlines()[1:]:
            entry = json.loads(line)
            if entry.get("action") == "add":
                names.add(os.path.basename(entry["path"]))
    return names


def read_windows(out: str, key: str = "user") -> Any:
    """user, start_ms, end_ms, n, total, done_ms (file mtime) of every committed result
    row (a query stopped during a micro-batch may leave files of an aborted one);
    ``key``: the key column, read as ``user``."""
    import pandas as pd
    import pyarrow.parquet as pq

    frames = []
    names = committed(out)
    for f in sorted(glob.glob(os.path.join(out, "*.parquet"))):
        if names is not None and os.path.basename(f) not in names:
            continue
        try:
            t = pq.read_table(f, columns=[key, "window_start", "window_end", "n", "total"])
        except Exception:  # a file being written
            continue
        df = t.to_pandas().rename(columns={key: "user"})
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


def compare(got: Any, batch: Any, complete_below_ms: int) -> dict[str, int]:
    """Emitted windows vs the batch, over the batch's windows ending at or below
    ``complete_below_ms``: ``windows`` (in the batch) = ``exact`` + ``differ`` (emitted
    with another count or sum) + ``missing`` (never emitted); ``unexpected`` (emitted,
    not in the batch), ``duplicates``; ``rows_lost`` = ``rows`` (in the batch's
    windows) - ``rows_emitted`` (in the first copy of each emitted window)."""
    exp = {(u, int(s)): (int(n), float(t)) for u, s, e, n, t in
           zip(batch["user"], batch["start_ms"], batch["end_ms"], batch["n"], batch["total"],
               strict=True) if e <= complete_below_ms}
    seen: set[tuple[str, int]] = set()
    c = dict.fromkeys(("exact", "differ", "unexpected", "duplicates", "rows_emitted"), 0)
    for u, s, e, n, t in zip(got["user"], got["start_ms"], got["end_ms"], got["n"], got["total"],
                             strict=True):
        k = (u, int(s))
        if e > complete_below_ms:
            continue  # beyond what the batch can judge
        if k in seen:
            c["duplicates"] += 1
            continue
        seen.add(k)
        want = exp.get(k)
        if want is None:
            c["unexpected"] += 1
            continue
        c["rows_emitted"] += int(n)
        same = want[0] == int(n) and np.isclose(want[1], float(t))
        c["exact" if same else "differ"] += 1
    rows = sum(n for n, _t in exp.values())
    return {**c, "windows": len(exp), "missing": sum(1 for k in exp if k not in seen),
            "rows": rows, "rows_lost": rows - c["rows_emitted"]}


def judged_to_ms(got: Any, floor_ms: int = 0) -> int:
    """Up to which window end a query's windows are judged: its last emitted window
    (a window query emits in window-end order), or ``floor_ms`` if later."""
    return int(max([floor_ms, *got["end_ms"]]))


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


def side(got: Any, cmp: dict[str, int], warm_ms: int) -> dict[str, Any]:
    """One query's JSON: windows, rows lost vs the batch, delays after warm-up."""
    n, mean, p50, p99 = delays(got, warm_ms)

    def ms(x: float) -> float | None:
        return None if np.isnan(x) else round(x, 1)

    return {"windows": len(got), "late_dropped": cmp["rows_lost"],
            "delay_mean_ms": ms(mean), "delay_p50_ms": ms(p50), "delay_p99_ms": ms(p99),
            "delay_windows": n, "differ_from_batch": cmp["differ"]}


def first_window_s(got: Any, started_ms: int) -> float | None:
    """Seconds from the command's start to a query's first result file."""
    return round(float(got["done_ms"].min() - started_ms) / 1000, 1) if len(got) else None


def first_window_floor_s(t0_ms: int, window_ms: int, lag_ms: int, started_ms: int) -> float:
    """Seconds from the command's start to when the data alone lets lowtide's first
    window close: the end of the window holding ``t0_ms`` (the fronts' first row), plus
    the lagging front's lag. Two micro-batches more (the one that reads its last rows,
    the one that emits it) and it is out, however fast the start-up.

    >>> first_window_floor_s(t0_ms=11_500, window_ms=2_000, lag_ms=5_000, started_ms=7_000)
    10.0
    """
    first_end_ms = (t0_ms // window_ms + 1) * window_ms
    return round((first_end_ms + lag_ms - started_ms) / 1000, 1)


def matches_batch(cmp: dict[str, int]) -> bool:
    """Every window the batch judges was emitted exactly, none twice, none unexpected."""
    return cmp["windows"] == cmp["exact"] and not (cmp["unexpected"] or cmp["duplicates"])


def print_table(args: argparse.Namespace, window: str, lt: dict[str, Any], wm: dict[str, Any],
                lt_cmp: dict[str, int], wm_cmp: dict[str, int], dropped_wm: int) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"lowtide vs withWatermark({args.watermark_ms} ms), front "
                    f"{args.fronts - 1} lagging {args.lag_ms} ms, {window} windows")
    for c in ("", "lowtide", "watermark"):
        t.add_column(c, justify="right")
    rows = [
        ("windows emitted", lt["windows"], wm["windows"]),
        ("rows dropped as late (missing vs batch)", lt["late_dropped"], wm["late_dropped"]),
        ("  Spark's numRowsDroppedByWatermark", "-", dropped_wm),
        ("windows differing from batch", lt_cmp["differ"], wm_cmp["differ"]),
        ("complete windows never emitted", lt_cmp["missing"], wm_cmp["missing"]),
        ("windows emitted twice", lt_cmp["duplicates"], wm_cmp["duplicates"]),
        ("windows ending after warm-up", lt["delay_windows"], wm["delay_windows"]),
        ("delay window end -> result, mean ms", lt["delay_mean_ms"], wm["delay_mean_ms"]),
        ("delay p50 ms", lt["delay_p50_ms"], wm["delay_p50_ms"]),
        ("  the lagging front's lag, ms", lt.get("lag_ms", "-"), wm.get("lag_ms", "-")),
        ("delay p99 ms", lt["delay_p99_ms"], wm["delay_p99_ms"]),
        ("first window, s after start", lt.get("first_window_s", "-"),
         wm.get("first_window_s", "-")),
    ]
    for r in rows:
        t.add_row(*(str(x) for x in r))
    Console().print(t)
