"""What happened to fronts that a consumer must see, not only a producer's exception:
registrations refused for being behind their segment (a producer that started late and
was not declared), declared fronts retired by their deadline, and live fronts found
dead (silent past the front timeout: retired, or waited for). Counted since the state
dir began: the engine feeds it from its refusals (live and replayed from the log) and
its steps, and snapshots keep it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from lowtide.core.dead_fronts import DeadFront
from lowtide.core.fronts import Declared
from lowtide.core.graph import SegmentGraph
from lowtide.service.progress import utc_text
from lowtide.wire.messages import ErrorCode, Refused


@dataclass
class FrontEvents:
    """The counts, and the latest events as one line each (``recent``)."""

    RECENT = 20

    behind: int = 0
    retired: int = 0
    dead_retired: int = 0  # live fronts retired as dead (the retire policy)
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=FrontEvents.RECENT))

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
                "dead_retired": self.dead_retired, "recent": list(self.recent)}

    def load(self, doc: dict[str, Any] | None) -> None:
        doc = doc or {}
        self.behind, self.retired = int(doc.get("behind", 0)), int(doc.get("retired", 0))
        self.dead_retired = int(doc.get("dead_retired", 0))
        self.recent = deque(doc.get("recent", ()), maxlen=self.RECENT)
