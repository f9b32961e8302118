"""The tracker a pipeline reports to: embedded (started here) or remote."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.spark.tracking.transport import TrackerRef


class TrackerHandle:
    """The tracker a pipeline reports to: embedded (started here) or remote."""

    def __init__(
        self,
        graph: SegmentGraph,
        grid: TimeGrid,
        url: str | None,
        secret: str | None,
        state_dir: str | None,
        stuck_after_ms: int,
        freeze_gc: bool = True,
        confirm: bool = True,
        pipeline: str = "default",
    ) -> None:
        """``pipeline``: the embedded tracker's metrics label (a remote tracker has its
        own, ``lowtide serve --pipeline``)."""
        self.graph, self.grid, self.secret = graph, grid, secret
        self.service: Any = None
        if url is None:
            from lowtide.service import TrackerService

            kwargs: dict[str, Any] = {
                "grid": grid,
                "state_dir": state_dir,
                "secret": secret.encode() if secret is not None else None,
                "freeze_gc": freeze_gc,
                "pipeline": pipeline,
            }
            if stuck_after_ms is not None:
                kwargs["stuck_after_ms"] = stuck_after_ms
            self.service = TrackerService.start(graph, **kwargs)
            url = self.service.url
        self.url: str = url  # type: ignore[assignment]
        self.ref = TrackerRef(self.url, graph, grid, secret, confirm)
        self._agent: Any = None

    @property
    def agent(self) -> Any:
        if self._agent is None:
            from lowtide.spark.tracking.transport import connect

            self._agent = connect(self.ref)
        return self._agent

    def status(self) -> dict[str, Any]:
        return dict(self.agent.status())

    def subscribe(self, segment: str | None) -> Iterator[Any]:
        it: Iterator[Any] = self.agent.subscribe(segment)
        return it

    def close(self) -> None:
        """Close this process's agent for the tracker, then stop an embedded tracker."""
        if self._agent is not None:
            close = getattr(self._agent, "close", None)
            if close is not None:
                close()
            self._agent = None
        if self.service is not None:
            self.service.stop()
            self.service = None
