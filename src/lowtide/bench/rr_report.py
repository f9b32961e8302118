"""The report side of ``lowtide bench rr``: what the figures show, the paper's numbers
beside them and notes on where they differ, all from the bench's JSON result (so
``lowtide bench paper`` can draw them from a saved run)."""

from __future__ import annotations

from typing import Any

from lowtide.bench.figures import Figure
from lowtide.bench.rr import NO_LOCAL, ROUTED, SHARDED, _fmt, punct

REPORT_INTRO = (
    "**RR-N on Spark (`lowtide bench rr`).** The paper's RR-N built as a PySpark "
    "micro-batch query: the generator's fronts (2, always backlogged), then N times "
    "`repartition(2)` + a pass-through map over Arrow batches, then a sink; N = 10, 30, "
    "100 where the machine allows (`--quick`: every mode at N = 3, none and lowtide at "
    "N = 10, a few batches each). A size "
    "is skipped when its untracked batch time, extrapolated linearly in N from the "
    "largest size measured, exceeds a limit; the JSON lists it under "
    "`graph_sizes_skipped` with the reason. Modes, one after the other in the same "
    "SparkSession: *none* (no tracking columns, JVM noop sink); *lowtide* (tracked maps, "
    "tracked null sink, embedded central tracker); *lowtide sharded (2)* (`lowtide serve "
    "--shards 2` on loopback, started and stopped by pid); *no local tracker* (the maps "
    "send every ack as a keyed message of its own, run on a small input because each "
    "message is a round trip; the message count per input is extrapolated exactly as "
    "2N + 2 acks per item); *punctuations g* (no tracker; a marker row per g items per "
    "front, broadcast at each shuffle to every partition by a route key while data rows "
    "stay round robin, and forwarded by a partition once it has every upstream copy); "
    "*none (route keys)*: the punctuations' plan without markers (hash partitioning on "
    "the route column, no sort before the shuffle), their baseline. Throughput is input "
    "rows per second of batch time after warm-up (and per CPU second of the whole "
    "process tree); ratios are against the baseline at the same N. "
    "Traffic: for the tracker, the keyed batches the tracker itself recorded (its dedup "
    "keys, per micro-batch; batches cut short by the final stop are left out and the "
    "count is checked against the tasks that ran: sources + N x p map tasks + the null "
    "sink's receipts from the p last-map tasks, per batch, each split in one message per "
    "shard when sharded); for punctuations, "
    "the marker rows moved across each shuffle and into the sink; both per 50K inputs. "
    "Notification latency: from the moment the last row of a batch (or the last copy of "
    "a marker) leaves the last map task, to the moment the driver holds the sink's min "
    "time update (or has counted every copy of the marker at the sink). Also reported: "
    "the tracker's delay after the sink's acks start (in the last map tasks; the "
    "definition of `lowtide bench spark`) and a marker's time from its front to the "
    "sink. Machine: 2 cores shared "
    "with other Spark users, so absolute rates are low and noisy; each Python stage "
    "adds a fixed cost per batch, which is why large N is slow here."
)

PAPER_THROUGHPUT = {
    "tracker, per-item": "7K of 9K items/s kept (22% overhead)",
    "punctuations, per-item": "under 1K items/s",
}
PAPER_TRAFFIC = {
    "local tracker": "0.2-0.5M messages per 50K inputs",
    "punctuations": "4-32M messages per 50K inputs",
}
PAPER_LATENCY = {"tracker": "0.2-3.5 ms, flat in graph size", "punctuations": "160-750 ms"}


def _get(result: dict[str, Any], mode: str, n: int, field: str) -> float | None:
    for r in result["results"]:
        if r["mode"] == mode and r["stages"] == n:
            v = r.get(field)
            return None if v is None else float(v)
    return None


def _by_size(result: dict[str, Any], modes: list[str], field: str) -> dict[str, list[Any]]:
    return {f"RR-{n}": [_get(result, m, n, field) for m in modes] for n in result["graph_sizes"]}


def _share(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.0%}"


def throughput_note(result: dict[str, Any]) -> str:
    parts = []
    for n in result["graph_sizes"]:
        lt, cpu = _get(result, "lowtide", n, "ratio"), _get(result, "lowtide", n, "cpu_ratio")
        p1 = _get(result, punct(1), n, "ratio")
        parts.append(f"RR-{n}: lowtide keeps {_share(lt)} of the untracked rate (CPU basis"
                     f" {_share(cpu)}), per-item punctuations {_share(p1)}")
    skipped = "; ".join(
        [f"RR-{k} skipped: {v}" for k, v in result["graph_sizes_skipped"].items()]
        + [f"{k} failed ({v})" for k, v in result.get("failed", {}).items()]
    )
    return (". ".join(parts) + ". The paper's tracker cost 22% at per-item granularity; "
            "here tracking is per micro-batch (one message per task), so its cost is the "
            "ack columns and hashing in each Python stage, not messages. Punctuations cost "
            "rows: per-item markers multiply the rows each shuffle moves by about p + 1. "
            "Punctuation ratios are against their own plan without markers (route keys, "
            "hash partitioning, no sort before the shuffle), the others against Spark's "
            "sorted round robin (lowtide's own repartition hashes its tracking column, "
            "unsorted). "
            + (skipped + ". " if skipped else "") + _load(result))


def _largest(result: dict[str, Any], mode: str, field: str, unit: str = "") -> str:
    """``field`` of ``mode`` at the largest graph size where it was measured."""
    for n in sorted(result["graph_sizes"], reverse=True):
        v = _get(result, mode, n, field)
        if v is not None:
            return f"{_fmt(v, unit)} (RR-{n})"
    return "n/a"


def _load(result: dict[str, Any]) -> str:
    load = result.get("load_avg_1m")
    return "" if load is None else (f"The machine's load average was {load} on 2 cores: "
                                    "few batches per run, so single ratios are noisy.")


def traffic_note(result: dict[str, Any]) -> str:
    rows = result["config"]["rows_per_batch"]
    marks = ", ".join(f"{_largest(result, punct(g), 'messages_per_50k')} at g={g}"
                      for g in result["config"]["granularities"])
    return (f"Per 50K inputs: lowtide {_largest(result, 'lowtide', 'messages_per_50k')} "
            f"tracker messages, sharded {_largest(result, SHARDED, 'messages_per_50k')} (one "
            f"per shard and task); one batch per task and micro-batch of {rows:,} rows, so "
            "the count follows batches, not items. Without a local tracker "
            f"{_largest(result, NO_LOCAL, 'messages_per_50k')} (2N + 2 acks per item, one "
            f"message each, extrapolated exactly from a small run). Marker rows: {marks}. "
            "The paper's 0.2-0.5M (local tracker) and 4-32M (punctuations) come from a "
            "pipelined engine whose local trackers flush by time.")


def latency_note(result: dict[str, Any]) -> str:
    ms = " ms"
    return ("p50 from the last row leaving the last map: lowtide "
            f"{_largest(result, 'lowtide', 'notify_p50_ms', ms)}, sharded "
            f"{_largest(result, SHARDED, 'notify_p50_ms', ms)}, punctuations (g=10) "
            f"{_largest(result, punct(10), 'notify_p50_ms', ms)}; the tracker's own part, "
            "from the sink's ack start to the update, is "
            f"{_largest(result, 'lowtide', 'after_commit_p50_ms', ms)} (sharded "
            f"{_largest(result, SHARDED, 'after_commit_p50_ms', ms)}). lowtide's comes "
            "from the last map tasks, which ack the null sink's receipts themselves; "
            "the markers' includes the end of the batch's Spark job (the count at the "
            "sink), which the paper's pipelined engine does not have; in micro-batch mode "
            "a marker travels inside its batch instead of queueing behind data, and every "
            "notification also waits for its batch (untracked batch "
            f"{_largest(result, 'none', 'batch_ms', ms)}). " + _load(result))


def figures(result: dict[str, Any]) -> list[Figure]:
    modes = [m for m in result["modes"] if any(r["mode"] == m for r in result["results"])]
    tracked = [m for m in modes if m not in ("none", ROUTED)]
    figs = [
        Figure("throughput_overhead", "RR-N on Spark: throughput per mode", "mode",
               "input rows/s", modes, _by_size(result, modes, "rows_per_s"), kind="barh",
               paper=PAPER_THROUGHPUT, note=throughput_note(result)),
        Figure("traffic_by_granularity_spark", "Service traffic per 50K inputs", "mode",
               "messages (marker rows for punctuations)", tracked,
               _by_size(result, tracked, "messages_per_50k"), kind="barh", log_y=True,
               paper=PAPER_TRAFFIC, note=traffic_note(result)),
    ]
    notified = [m for m in tracked if m != NO_LOCAL]
    figs.append(Figure(
        "notification_latency_spark", "Notification latency after the last row (p50)",
        "mode", "ms", notified, _by_size(result, notified, "notify_p50_ms"), kind="barh",
        log_y=True, paper=PAPER_LATENCY, note=latency_note(result)))
    sizes = result["graph_sizes"]
    if len(sizes) > 1:
        figs.append(Figure(
            "throughput_by_graph_size_spark", "Throughput kept vs untracked, by graph size",
            "N", "ratio to none", sizes,
            {m: [_get(result, m, n, "ratio") for n in sizes] for m in tracked if m != NO_LOCAL},
            kind="line", paper=PAPER_THROUGHPUT, note=throughput_note(result)))
        figs.append(Figure(
            "latency_by_graph_size_spark", "Notification latency p50 by graph size", "N",
            "ms", sizes, {m: [_get(result, m, n, "notify_p50_ms") for n in sizes]
                          for m in notified}, kind="line", log_y=True,
            paper=PAPER_LATENCY, note=latency_note(result)))
    return figs
