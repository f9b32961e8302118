"""Figures of the evaluation: data first, drawing apart.

A sub-bench turns its JSON result into :class:`Figure` values; ``lowtide bench paper``
draws each as a PNG (matplotlib, imported only here and only when drawing) and writes
its numbers as a markdown table beside it, so every plotted point is also readable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("bar", "line", "barh")


@dataclass(frozen=True)
class Figure:
    """One plot: categories (or x values) and named series aligned with them.

    ``paper`` holds the tracker paper's figures for the same axes where it gives them
    (label -> text, e.g. ``{"notification latency": "0.2-3.5 ms"}``); ``note`` is the
    paragraph on where and why ours differ.
    """

    name: str  # file stem, e.g. "traffic_by_graph_size"
    title: str
    x_label: str
    y_label: str
    x: Sequence[str | int | float]
    series: dict[str, Sequence[float | None]]
    kind: str = "bar"
    log_y: bool = False
    paper: dict[str, str] = field(default_factory=dict)
    note: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"figure {self.name}: kind must be one of {KINDS}, got {self.kind}")
        for label, values in self.series.items():
            if len(values) != len(self.x):
                raise ValueError(
                    f"figure {self.name}: series {label!r} has {len(values)} values "
                    f"for {len(self.x)} x values"
                )


def _cell(v: float | None) -> str:
    if v is None:
        return "-"
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"


def table_md(fig: Figure) -> str:
    """The figure's numbers as a markdown table: one row per x value."""
    labels = list(fig.series)
    head = f"| {fig.x_label} | " + " | ".join(labels) + " |"
    rule = "|---|" + "---:|" * len(labels)
    rows = [
        f"| {x} | " + " | ".join(_cell(fig.series[s][i]) for s in labels) + " |"
        for i, x in enumerate(fig.x)
    ]
    return "\n".join([head, rule, *rows])


def draw(fig: Figure, out_dir: Path) -> Path:
    """Write ``<out_dir>/<name>.png`` in the paper's style: grouped bars (or lines),
    one colour per tracking mode, a legend, labelled axes."""
    import matplotlib

    matplotlib.use("Agg")  # no screen here; set before pyplot is imported
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{fig.name}.png"
    f, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    try:
        _plot(ax, fig)
        ax.set_title(fig.title)
        ax.grid(axis="x" if fig.kind == "barh" else "y", alpha=0.3)
        if len(fig.series) > 1:
            ax.legend(fontsize="small")
        f.tight_layout()
        f.savefig(path)
    finally:
        plt.close(f)
    return path


def _plot(ax: object, fig: Figure) -> None:
    import numpy as np

    labels = [str(x) for x in fig.x]
    pos = np.arange(len(labels))
    n = max(len(fig.series), 1)
    width = 0.8 / n
    for i, (label, values) in enumerate(fig.series.items()):
        ys = [np.nan if v is None else float(v) for v in values]
        if fig.kind == "line":
            ax.plot([float(x) for x in fig.x], ys, marker="o", label=label)  # type: ignore[attr-defined]
        elif fig.kind == "barh":
            ax.barh(pos + i * width - 0.4 + width / 2, ys, height=width, label=label)  # type: ignore[attr-defined]
        else:
            ax.bar(pos + i * width - 0.4 + width / 2, ys, width=width, label=label)  # type: ignore[attr-defined]
    if fig.kind == "barh":
        ax.set_yticks(pos, labels)  # type: ignore[attr-defined]
        ax.set_xlabel(fig.y_label)  # type: ignore[attr-defined]
        ax.set_ylabel(fig.x_label)  # type: ignore[attr-defined]
        if fig.log_y:
            ax.set_xscale("log")  # type: ignore[attr-defined]
        return
    if fig.kind == "bar":
        ax.set_xticks(pos, labels)  # type: ignore[attr-defined]
    ax.set_xlabel(fig.x_label)  # type: ignore[attr-defined]
    ax.set_ylabel(fig.y_label)  # type: ignore[attr-defined]
    if fig.log_y:
        ax.set_yscale("log")  # type: ignore[attr-defined]
