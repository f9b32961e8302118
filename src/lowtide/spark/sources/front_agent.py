"""What a :class:`lowtide.Front` needs from the agent it is given (``lowtide.service.Agent``
has all of it): besides the Spark layer's calls, the tracker's graph and grid, its
status (where a predecessor's front stands), flushing, following the tracker's graph
generations (a front joins a consumer attached while it runs), unregistering and the
late counts. A stand-in agent (a test's) implements the same methods: the front never
asks whether a method is there.
"""

from __future__ import annotations

from typing import Any, Protocol

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.spark.tracking.transport import AgentLike

__all__ = ["FrontAgent"]


class FrontAgent(AgentLike, Protocol):
    """The agent of a front (see the module docstring)."""

    graph: SegmentGraph

    @property
    def grid(self) -> TimeGrid: ...

    def status(self, timeout_s: float = 10.0) -> dict[str, Any]: ...

    def flush(self, timeout_s: float = 30.0) -> None: ...

    def follow_graph(self, timeout_s: float = 10.0) -> SegmentGraph: ...

    def unregister_front(
        self, front: int, timeout_s: float = 30.0, *, owner: str | None = None
    ) -> None: ...

    def report_late(self, front: int, counts: tuple[int, int, int, int],
                    timeout_s: float = 10.0) -> None: ...
