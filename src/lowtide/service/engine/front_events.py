"""What happened to fronts that a consumer must see, not only a producer's exception:
registrations refused for being behind their segment (a producer that started late and
was not declared), declared fronts retired by their deadline, live fronts found
dead (silent past the front timeout: retired, or waited for), and the late records each
front reported (:class:`~lowtide.wire.messages.FrontLate`: clamped, rejected, raised,
out of range; the latest report of a front stands). Counted since the state dir began:
the engine feeds it from its refusals (live and replayed from the log), its steps and
the fronts' reports, and snapshots keep it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from lowtide.core.dead_fronts import DeadFront
from lowtide.core.fronts import Declared
from lowtide.core.graph import SegmentGraph
from lowtide.service.progress import utc_text
from lowtide.wire.messages import ErrorCode, FrontLate, Refused

#: what a front did with its late records, as status documents name them
LATE_OUTCOMES = ("late_clamped", "late_rejected", "late_raised", "out_of_range")


@dataclass
class FrontEvents:
    """The counts, and the latest events as one line each (``recent``)."""

    RECENT = 20

    behind: int = 0
    retired: int = 0
    dead_retired: int = 0  # live fronts retired as dead (the retire policy)
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=FrontEvents.RECENT))
    #: front -> its late counts (LATE_OUTCOMES); (session, req) of the report, in memory
    late: dict[str, dict[str, int]] = field(default_factory=dict)
    _reported: dict[str, tuple[int, int]] = field(default_factory=dict)

    def report_late(self, msg: FrontLate) -> None:
        """A front's totals; a resent older report of the same session changes nothing."""
        front = str(msg.front)
        session, req = self._reported.get(front, (0, 0))
        if msg.session == session and msg.req < req:
            return
        self._reported[front] = (msg.session, msg.req)
        counts = (msg.clamped, msg.rejected, msg.raised, msg.out_of_range)
        self.late[front] = dict(zip(LATE_OUTCOMES, counts, strict=True))

    def refused(self, refused: Refused) -> None:
        if refused.code == ErrorCode.FRONT_BEHIND:
            self.behind += 1
            self.recent.append(f"refused: {refused.message}")

    def retire(self, fronts: tuple[Declared, ...], graph: SegmentGraph) -> None:
        for d in fronts:
            self.retired += 1
            self.recent.append(
                f"retired: front {d.front} was declared on {graph.names[d.segment]!r} and "
                f"did not register by its deadline; its segment no longer waits for it")

    def dead(self, fronts: tuple[DeadFront, ...], graph: SegmentGraph) -> None:
        for d in fronts:
            self.dead_retired += d.retired_ms is not None
            self.recent.append(d.describe(graph.names, utc_text))

    def export(self) -> dict[str, Any]:
        return {"behind": self.behind, "retired": self.retired,
                "dead_retired": self.dead_retired, "recent": list(self.recent),
                "late": {f: dict(c) for f, c in self.late.items()}}

    def load(self, doc: dict[str, Any] | None) -> None:
        doc = doc or {}
        self.behind, self.retired = int(doc.get("behind", 0)), int(doc.get("retired", 0))
        self.dead_retired = int(doc.get("dead_retired", 0))
        self.recent = deque(doc.get("recent", ()), maxlen=self.RECENT)
        self.late = {str(f): {k: int(v) for k, v in c.items()}
                     for f, c in doc.get("late", {}).items()}
