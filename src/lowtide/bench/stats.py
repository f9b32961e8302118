"""Small statistics shared by the benchmarks' JSON results."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile rounded to 3 decimals; None (JSON null) without values.

    >>> percentile([1.0, 2.0, 3.0], 50), percentile([], 99)
    (2.0, None)
    """
    return round(float(np.percentile(values, q)), 3) if len(values) else None
