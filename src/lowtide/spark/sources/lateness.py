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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt

from lowtide.core.errors import LowtideError

__all__ = ["LATE_POLICIES", "LatePolicy", "LateRecords", "LateStats"]

LATE_POLICIES = ("clamp", "reject", "raise")


class LateRecords(LowtideError, ValueError):
    """Records older than the front's promise under ``late="raise"``."""


@dataclass
class LateStats:
    """What a front did with the records it was given (counts since it started)."""

    labelled: int = 0
    written: int = 0
    late_clamped: int = 0
    late_rejected: int = 0
    late_raised: int = 0

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

    def apply(
        self, slots: npt.NDArray[np.int64], promise: int, stats: LateStats
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
        """(the labels of the kept records, their positions; None: all kept, in order)."""
        slots = np.asarray(slots, np.int64)
        late = slots < promise
        n_late = int(late.sum())
        if n_late == 0:
            return slots, None
        if self.name == "clamp":
            stats.late_clamped += n_late
            return np.maximum(slots, promise), None
        if self.name == "reject":
            stats.late_rejected += n_late
            kept = np.flatnonzero(~late).astype(np.int64)
            return slots[kept], kept
        stats.late_raised += n_late
        raise LateRecords(f"{n_late} records have event times below the front's promise "
                          f"(slot {promise}): pass late='clamp' or 'reject' to keep them")
