"""Late records at an event-time front: the promise holds, and nothing is dropped
silently.

A front that labels records with their own event time (``time_from="ts"``) has
promised, by its last heartbeat ``h``, that no record with a time below ``h`` follows.
A record whose event slot is below ``h`` is *late*; the policy decides, and counts:

``"clamp"``
    labelled ``h`` instead (the earliest time the front may still label), so it joins
    the first window that is not yet complete; counted in ``late_clamped``.
``"reject"``
    not labelled: returned to the producer (``Labelled.rejected``) to store, resend
    with a new identity or report; counted in ``late_rejected``.
``"raise"``
    :class:`LateRecords`; nothing of the batch is labelled or acked; counted in
    ``late_raised``.

>>> import numpy as np
>>> stats = LateStats()
>>> times, kept = LatePolicy("clamp").apply(np.array([5, 9, 12]), 10, stats)
>>> times.tolist(), kept, stats.late_clamped
([10, 10, 12], None, 2)
>>> times, kept = LatePolicy("reject").apply(np.array([5, 9, 12]), 10, stats)
>>> times.tolist(), kept.tolist(), stats.late_rejected
([12], [2], 2)

Out of range. A time past ``limit`` (the front's clock plus ``max_ahead_ms``: a unit
mix-up) or before the epoch is no event time at all: under ``"raise"`` the batch is
refused, else the record is returned like a rejected one; counted in ``out_of_range``.
Either way it is found before any ack is sent, so it never fails a flush of good
records after they were written.

A front reports its counts to the tracker (status views show them, per front); a
window's output can count its own clamped records: :func:`clamped_flag` marks each
record whose label is above its event time, and ``("clamped", "sum")`` counts them.

>>> times, kept = LatePolicy("clamp").apply(np.array([12, 10**12, -3]), 10, stats, limit=100)
>>> times.tolist(), kept.tolist(), stats.out_of_range
([12], [0], 2)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from lowtide.core.errors import LowtideError
from lowtide.spark.sources.labels import TIME_COLUMN

__all__ = ["LATE_POLICIES", "LatePolicy", "LateRecords", "LateStats", "TimesOutOfRange",
           "clamped_flag"]

LATE_POLICIES = ("clamp", "reject", "raise")


class LateRecords(LowtideError, ValueError):
    """Records older than the front's promise under ``late="raise"``."""


class TimesOutOfRange(LateRecords):
    """Records whose event time is no time the tracker can take (far in the future,
    or before the epoch) under ``late="raise"``."""


@dataclass
class LateStats:
    """What a front did with the records it was given (counts since it started)."""

    labelled: int = 0
    written: int = 0
    late_clamped: int = 0
    late_rejected: int = 0
    late_raised: int = 0
    out_of_range: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class LatePolicy:
    name: str = "clamp"
    lag_slots: int = 0

    def __post_init__(self) -> None:
        if self.name not in LATE_POLICIES:
            raise ValueError(f"late must be one of {LATE_POLICIES}, got {self.name!r}")
        if self.lag_slots < 0:
            raise ValueError("lag_ms must be >= 0")

    @staticmethod
    def in_range(slots: npt.NDArray[np.int64], limit: int | None) -> npt.NDArray[np.bool_]:
        """Which slots are event times at all: not before the epoch nor past ``limit``."""
        slots = np.asarray(slots, np.int64)
        return (slots >= 0) if limit is None else (slots >= 0) & (slots <= limit)

    def apply(
        self, slots: npt.NDArray[np.int64], promise: int, stats: LateStats,
        limit: int | None = None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
        """(the labels of the kept records, their positions; None: all kept, in order)."""
        slots = np.asarray(slots, np.int64)
        valid = self.in_range(slots, limit)
        n_bad = len(slots) - int(valid.sum())
        late = valid & (slots < promise)
        n_late = int(late.sum())
        if self.name == "raise" and (n_bad or n_late):
            stats.out_of_range += n_bad
            stats.late_raised += n_late
            if n_bad:
                raise TimesOutOfRange(
                    f"{n_bad} records have event times outside [epoch, front clock + "
                    f"max_ahead_ms] (slot {limit}): a unit mix-up? Nothing of the batch "
                    "was labelled")
            raise LateRecords(f"{n_late} records have event times below the front's "
                              f"promise (slot {promise}): pass late='clamp' or 'reject' "
                              "to keep them")
        stats.out_of_range += n_bad
        if self.name == "clamp":
            stats.late_clamped += n_late
            slots = np.maximum(slots, promise)
            keep = valid
        else:
            stats.late_rejected += n_late
            keep = valid & ~late
        if keep.all():
            return slots, None
        kept = np.flatnonzero(keep).astype(np.int64)
        return slots[kept], kept


def clamped_flag(event_time: Any, delta_ms: int) -> Any:
    """A Spark column: 1 for a record its front clamped (its label ``lt_time`` is above
    the slot of ``event_time``, a timestamp column), else 0. Add it before
    ``Pipeline.read_stream`` (where the labels are columns) and sum it in a window's
    aggregates to count the window's clamped records::

        df = df.withColumn("clamped", clamped_flag(col("ts"), pipe.grid.delta_ms))
        pipe.read_stream(df).window("1 minute", key="k").agg(late=("clamped", "sum"))
    """
    from pyspark.sql import functions as F

    slot = F.floor(F.unix_millis(event_time) / F.lit(delta_ms))
    return (slot < F.col(TIME_COLUMN)).cast("long")
