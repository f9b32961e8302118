"""`lowtide bench paper`: every evaluation sub-bench, its figures and one markdown report.

Each sub-bench runs in its own process (``lowtide bench <name> [--quick]``): Spark
sessions, shard processes and their memory end with it, and one failing bench cannot
take the others down. Its last stdout line is its JSON result; the module's
``figures(result)`` turns that into :class:`~lowtide.bench.figures.Figure` values, which
are drawn as PNGs and written as tables in the report beside the paper's numbers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lowtide.bench.figures import Figure, draw, table_md


@dataclass(frozen=True)
class SubBench:
    """A sub-bench: its name, the module with ``figures``/``REPORT_INTRO``, and the
    command that runs it (default: ``lowtide bench <name>``)."""

    name: str
    module: str
    argv: tuple[str, ...] = ()

    def command(self, quick: bool) -> list[str]:
        base = list(self.argv) or [sys.executable, "-m", "lowtide.cli", "bench", self.name]
        return [*base, "--quick"] if quick else base


SUB_BENCHES: tuple[SubBench, ...] = (
    SubBench("sim", "lowtide.bench.sim"),
    SubBench("rr", "lowtide.bench.rr_report"),
    SubBench("capacity", "lowtide.bench.capacity_report"),
    SubBench("sweep", "lowtide.bench.sweep"),
)


@dataclass
class Outcome:
    bench: SubBench
    seconds: float
    result: dict[str, Any] | None = None
    error: str = ""
    figures: list[Figure] = field(default_factory=list)


def last_json(stdout: str) -> dict[str, Any]:
    """The JSON object on the last non-empty stdout line (the sub-bench contract)."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("no output")
    doc = json.loads(lines[-1])
    if not isinstance(doc, dict) or "bench" not in doc:
        raise ValueError(f"last line is not a bench result: {lines[-1][:200]}")
    return doc


def run_one(bench: SubBench, quick: bool, log_dir: Path, timeout_s: float) -> Outcome:
    """Run one sub-bench; its stderr (progress) goes on to ours as it comes."""
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"[paper] {bench.name}: {' '.join(bench.command(quick))}", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(
            bench.command(quick), stdout=subprocess.PIPE, stderr=None, text=True,
            timeout=timeout_s, check=False,
        )
    except subprocess.TimeoutExpired:
        seconds = time.monotonic() - started
        return Outcome(bench, seconds, error=f"timed out after {timeout_s:.0f} s")
    seconds = time.monotonic() - started
    (log_dir / f"{bench.name}.out").write_text(proc.stdout)
    if proc.returncode != 0:
        return Outcome(bench, seconds, error=f"exit code {proc.returncode}")
    try:
        result = last_json(proc.stdout)
    except ValueError as exc:
        return Outcome(bench, seconds, error=f"bad output: {exc}")
    (log_dir / f"{bench.name}.json").write_text(json.dumps(result, indent=1))
    return with_figures(Outcome(bench, seconds, result))


def with_figures(outcome: Outcome) -> Outcome:
    try:
        module = importlib.import_module(outcome.bench.module)
        outcome.figures = list(module.figures(outcome.result))
    except Exception as exc:  # a broken figure must not lose the other benches' report
        outcome.error = f"figures failed: {type(exc).__name__}: {exc}"
    return outcome


def machine() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{platform.machine()}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, "
        f"Python {platform.python_version()}, load average {load[0]:.1f} at the end"
    )


def section(outcome: Outcome, fig_dir: Path, report_dir: Path) -> list[str]:
    """The report's section for one sub-bench: intro, then each figure with its table."""
    name = outcome.bench.name
    out = [f"## {name}", "", f"`lowtide bench {name}` took {outcome.seconds:.0f} s.", ""]
    if outcome.error:
        out += [f"**Failed: {outcome.error}.** See `logs/{name}.out`.", ""]
    try:
        intro = str(importlib.import_module(outcome.bench.module).REPORT_INTRO)
    except (ImportError, AttributeError) as exc:
        intro = f"(no description: {exc})"
    out += [intro.strip(), ""]
    for fig in outcome.figures:
        png = draw(fig, fig_dir)
        out += [f"### {fig.title}", "", f"![{fig.title}]({png.relative_to(report_dir)})", ""]
        out += [table_md(fig), ""]
        if fig.paper:
            out += ["The paper: " + "; ".join(f"{k}: {v}" for k, v in fig.paper.items()) + ".", ""]
        if fig.note:
            out += [fig.note.strip(), ""]
    return out


def write_report(outcomes: Sequence[Outcome], out_dir: Path, quick: bool) -> Path:
    report = out_dir / "report.md"
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# lowtide against the tracker paper's evaluation",
        "",
        f"Made by `lowtide bench paper{' --quick' if quick else ''}` on {stamp}; "
        f"machine: {machine()}.",
        "Each section is one sub-bench; each runs alone too (`lowtide bench <name>`) and its "
        "raw result is in `logs/<name>.json`.",
        "",
    ]
    for outcome in outcomes:
        lines += section(outcome, out_dir / "figures", out_dir)
    report.write_text("\n".join(lines))
    return report


def summary(outcomes: Sequence[Outcome]) -> str:
    rows = [f"{'bench':<10} {'status':<8} {'seconds':>8} {'figures':>8}"]
    for o in outcomes:
        status = "failed" if o.error else "ok"
        rows.append(f"{o.bench.name:<10} {status:<8} {o.seconds:>8.0f} {len(o.figures):>8}")
        if o.error:
            rows.append(f"    {o.error}")
    return "\n".join(rows)


def run(args: argparse.Namespace, benches: Sequence[SubBench] = SUB_BENCHES) -> dict[str, Any]:
    chosen = [b for b in benches if not args.only or b.name in args.only]
    unknown = set(args.only or ()) - {b.name for b in benches}
    if unknown:
        raise SystemExit(f"lowtide bench paper: unknown sub-bench {sorted(unknown)}; "
                         f"choose from {[b.name for b in benches]}")
    out_dir = Path(args.out)
    outcomes = [run_one(b, args.quick, out_dir / "logs", args.timeout_s) for b in chosen]
    report = write_report(outcomes, out_dir, args.quick)
    print(summary(outcomes))
    print(f"report: {report}")
    return {
        "bench": "paper",
        "report": str(report),
        "figures": sum(len(o.figures) for o in outcomes),
        "failed": [o.bench.name for o in outcomes if o.error],
    }


def main(args: argparse.Namespace) -> int:
    doc = run(args)
    print(json.dumps(doc))
    return 1 if doc["failed"] else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small sizes: under 10 minutes here")
    p.add_argument("--out", default="lowtide-paper", help="report directory (made if missing)")
    p.add_argument("--only", action="append", metavar="NAME",
                   help="run only this sub-bench (repeatable): " +
                        ", ".join(b.name for b in SUB_BENCHES))
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per sub-bench")
    p.set_defaults(handler=main)


def register(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    add_arguments(bench.add_parser(
        "paper", help="the tracker paper's evaluation: every sub-bench, PNG figures, a report"
    ))
