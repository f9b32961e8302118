"""What the session windows' tests without Spark share: their aggregates, input rows
as the runtime hands them to the logic, random inputs and the batch sessionization."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from hypothesis import strategies as st

from lowtide.spark.operators.sessions import GAP_COL
from lowtide.spark.operators.slot_logic import ID_COL, SLOT_COL
from lowtide.spark.operators.window_aggs import bind_aggs
from lowtide.spark.operators.windows import parse_aggs

DELTA_MS = 10
AGGS, _ = bind_aggs("s", parse_aggs({"n": "count", "s": ("v", "sum"), "f": ("v", "first")}),
                    {"v": "bigint"}, "session_window")


def rows(slots: list[int], ids: list[int] | None = None, gaps: list[int] | None = None
         ) -> pd.DataFrame:
    ids = ids if ids is not None else list(range(1, len(slots) + 1))
    frame = pd.DataFrame({"lt_agg0": np.array(slots, np.int64),
                          "lt_valid0": np.ones(len(slots), bool),
                          SLOT_COL: np.array(slots, np.int64), ID_COL: np.array(ids, np.int64)})
    if gaps is not None:
        frame[GAP_COL] = np.array(gaps, np.int64)
    return frame


def batch_sessions(items: list[tuple[int, int, int]]) -> set[tuple[int, int, int, int, int]]:
    """(start, end, n, sum, first) of each session over the whole input: Spark's rule,
    each row [slot, slot + gap] (gap > 0), overlapping or touching ones merged."""
    out = set()
    cur: list[tuple[int, int, int]] = []
    end = -1
    for s, i, gap in sorted((s, i, g) for s, i, g in items if g > 0):
        if cur and s > end:
            out.add((cur[0][0], end, len(cur), sum(c[0] for c in cur), min(cur)[0]))
            cur = []
        end = max(end, s + gap) if cur else s + gap
        cur.append((s, i, gap))
    if cur:
        out.add((cur[0][0], end, len(cur), sum(c[0] for c in cur), min(cur)[0]))
    return out


@st.composite
def inputs(draw: Any) -> tuple[list[tuple[int, int, int]], int, list[int]]:
    fixed = draw(st.sampled_from([0, 1, 3, 6]))  # 0: per-row gaps
    n = draw(st.integers(0, 40))
    slots = draw(st.lists(st.integers(0, 60), min_size=n, max_size=n))
    gaps = draw(st.lists(st.integers(-1, 8), min_size=n, max_size=n)) if not fixed \
        else [fixed] * n
    ids = draw(st.permutations(range(1, n + 1)))
    steps = draw(st.lists(st.integers(0, 10), min_size=1, max_size=30))
    return list(zip(slots, ids, gaps, strict=True)), fixed, steps
