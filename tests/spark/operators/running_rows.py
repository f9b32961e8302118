"""What the ``groupBy`` tests without Spark share: their aggregates and input rows as
the runtime hands them to the logic."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lowtide.spark.operators.slot_logic import ID_COL, SLOT_COL
from lowtide.spark.operators.window_aggs import bind_aggs
from lowtide.spark.operators.windows import parse_aggs

DELTA_MS = 10
AGGS, _ = bind_aggs("g", parse_aggs({"n": "count", "s": ("v", "sum"), "l": ("v", "last"),
                                     "d": ("v", "count_distinct")}), {"v": "bigint"},
                    "groupBy")


def rows(slots: list[int], ids: list[int] | None = None,
         values: list[int] | None = None) -> pd.DataFrame:
    ids = ids if ids is not None else list(range(1, len(slots) + 1))
    values = values if values is not None else slots
    return pd.DataFrame({"lt_agg0": np.array(values, np.int64),
                         "lt_valid0": np.ones(len(slots), bool),
                         SLOT_COL: np.array(slots, np.int64), ID_COL: np.array(ids, np.int64)})
