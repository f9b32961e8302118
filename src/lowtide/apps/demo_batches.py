"""Where a demo query's time goes, read back from its checkpoint and output: when each
micro-batch was planned and committed, how long the start-up phases took, and for
lowtide's windows how many micro-batches came between the one that received a
window's last rows and the one that emitted it (the plan's floor is 1: Spark applies a
batch's watermark from the next batch on).

A window of the demo ends at ``E``; the first micro-batch whose planned generator
offsets promise every front past ``E`` (each front's ``hb``, its heartbeat slot) reads
the window's last rows; its stamps pass ``E``, and the next batch emits it. So its
delay is the lag, the wait for that batch, and two micro-batches:
``batch_p50_ms`` beside the delays makes the gap to that floor visible.
"""

from __future__ import annotations

import glob
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

#: lowtide's file sink names its files after the micro-batch that wrote them
_BATCH_OF_FILE = re.compile(r"-(\d{10})-\d+\.parquet$")


def batch_times(ckpt: str, delta_ms: int = 10) -> dict[int, dict[str, int | None]]:
    """Per committed or planned micro-batch of a generator query: ``plan_ms`` (Spark's
    batch timestamp), ``watermark_ms``, ``fronts_ms`` (the lowest front heartbeat its
    offsets promise, ms; None for a source without one), ``commit_ms`` (its commit
    log entry's mtime; None while running)."""
    out: dict[int, dict[str, int | None]] = {}
    for p in glob.glob(os.path.join(ckpt, "offsets", "[0-9]*")):
        lines = Path(p).read_text().strip().splitlines()
        meta = json.loads(lines[1])
        beats = [int(v["hb"]) * delta_ms for line in lines[2:]
                 for k, v in offsets_doc(line).items() if k[:1] == "f" and isinstance(v, dict)
                 and "hb" in v]
        commit = os.path.join(ckpt, "commits", os.path.basename(p))
        out[int(os.path.basename(p))] = {
            "plan_ms": int(meta["batchTimestampMs"]),
            "watermark_ms": int(meta["batchWatermarkMs"]),
            "fronts_ms": min(beats) if beats else None,
            "commit_ms": (os.stat(commit).st_mtime_ns // 1_000_000
                          if os.path.exists(commit) else None)}
    return out


def offsets_doc(line: str) -> dict[str, Any]:
    """One line of an offsets log entry as a dict ({} if it is not a JSON object)."""
    try:
        doc = json.loads(line)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def batch_p50_ms(times: dict[int, dict[str, int | None]], since_ms: int) -> float | None:
    """Median time from plan to commit of the micro-batches planned at or after
    ``since_ms``."""
    took = [t["commit_ms"] - t["plan_ms"] for t in times.values()  # type: ignore[operator]
            if t["commit_ms"] is not None and t["plan_ms"] >= since_ms]  # type: ignore[operator]
    return round(float(np.median(took)), 1) if took else None


def emitted_in(out: str) -> dict[int, int]:
    """Window end (ms) -> the micro-batch whose files first hold it (lowtide's sink)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    first: dict[int, int] = {}
    for f in glob.glob(os.path.join(out, "*.parquet")):
        m = _BATCH_OF_FILE.search(f)
        if m is None:
            continue
        col = pq.read_table(f, columns=["window_end"]).column(0)
        for end in col.cast(pa.timestamp("ms", col.type.tz)).cast(pa.int64()).to_pylist():
            first[end] = min(first.get(end, int(m.group(1))), int(m.group(1)))
    return first


def batches_after_input(times: dict[int, dict[str, int | None]], emitted: dict[int, int],
                        since_ms: int) -> list[int]:
    """Per window ending at or after ``since_ms``: its emitting batch minus the first
    batch that read its last rows (the first whose offsets promise every front past
    its end).

    >>> times = {0: {"fronts_ms": 900}, 1: {"fronts_ms": 2100}, 2: {"fronts_ms": 3000}}
    >>> batches_after_input(times, {1000: 2, 2000: 2, 3000: 4}, 1000)
    [1, 1, 2]
    """
    out = []
    for end, batch in sorted(emitted.items()):
        reads = [n for n, t in times.items() if (t["fronts_ms"] or 0) >= end]
        if end >= since_ms and reads:
            out.append(batch - min(reads))
    return out


def startup(times: dict[int, dict[str, int | None]], ckpt: str, started_ms: int
            ) -> dict[str, float | None]:
    """Seconds from the command's start to: the query's start (its checkpoint's
    metadata file), its first batch planned, that batch committed."""
    def s(ms: int | None) -> float | None:
        return None if ms is None else round((ms - started_ms) / 1000, 1)

    meta = os.path.join(ckpt, "metadata")
    first = times.get(0, {})
    return {"query_started_s": s(os.stat(meta).st_mtime_ns // 1_000_000
                                 if os.path.exists(meta) else None),
            "first_batch_planned_s": s(first.get("plan_ms")),
            "first_batch_done_s": s(first.get("commit_ms"))}


#: the phases of a micro-batch Spark reports (``durationMs``), in the order they run
PHASES = ("latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit",
          "commitOffsets", "triggerExecution")


def phases_p50_ms(progress: list[dict[str, Any]], warm_batches: int = 2) -> dict[str, float]:
    """Median of each phase (``durationMs``, ms) over the micro-batches after the first
    ``warm_batches`` (the ones that start Python workers and state stores; the demo is
    warm once two are done); ``progress``: a query's ``recentProgress`` as dicts. A
    batch that ran no phase of a kind counts 0 for it.

    >>> p = [{"batchId": 1, "durationMs": {"addBatch": 9000}},
    ...      {"batchId": 2, "durationMs": {"addBatch": 500, "walCommit": 20}},
    ...      {"batchId": 3, "durationMs": {"addBatch": 700, "walCommit": 40}}]
    >>> phases_p50_ms(p)
    {'addBatch': 600.0, 'walCommit': 30.0}
    """
    warm = [p["durationMs"] for p in progress if p["batchId"] >= warm_batches]
    return {k: round(float(np.median([d.get(k, 0) for d in warm])), 1)
            for k in PHASES if any(k in d for d in warm)}
