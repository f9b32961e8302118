"""A user's fold for the ``stateful`` tests (plain and speculative): a running count
and sum per user, one row per (user, slot), and its batch recomputation."""

from __future__ import annotations

from typing import Any

import pandas as pd


def running(key: tuple[Any, ...], rows: pd.DataFrame, state: Any) -> tuple[Any, pd.DataFrame]:
    n, total = state or (0, 0.0)
    n, total = n + len(rows), total + float(rows["amount"].sum())
    return (n, total), pd.DataFrame({"n": [n], "total": [total], "rows": [len(rows)]})


def batch_fold(rows: pd.DataFrame) -> pd.DataFrame:
    """The batch recomputation: per (user, slot) with rows, the running count and sum."""
    g = rows.groupby(["user", "slot"]).agg(rows=("amount", "size"), amount=("amount", "sum"))
    g = g.reset_index().sort_values(["user", "slot"])
    g["n"] = g.groupby("user")["rows"].cumsum()
    g["total"] = g.groupby("user")["amount"].cumsum()
    return g.set_index(["user", "slot"])
