"""The tracker a pipeline reports to: embedded (started here) or remote."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from lowtide.core.dead_fronts import FrontTimeout
from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service.freshness import Sla
from lowtide.spark.pipeline.dag import PipelineShapeError
from lowtide.spark.pipeline.describe import duration_of
from lowtide.spark.tracking.transport import HOLD_WAIT_S, TrackerRef

#: how long a detach waits for the fronts of a released log consumer to leave it (a
#: front that stopped never does: its segment is detached all the same)
FRONTS_LEAVE_S = 5.0


@dataclass(frozen=True)
class TrackerOptions:
    """How a pipeline reaches its tracker (``Pipeline``'s keyword arguments).

    ``url`` None starts an embedded tracker; ``pipeline`` is its metrics label (a
    remote tracker has its own, ``lowtide serve --pipeline``); ``web_port`` serves the
    embedded tracker's web view (0: a free port; None: off), see docs/service.md."""

    url: str | None = None
    secret: str | None = None
    state_dir: str | None = None
    stuck_after_ms: int = 5_000
    freeze_gc: bool = True
    confirm: bool = True
    pipeline: str = "default"
    web_port: int | None = None
    #: a front silent this long is dead (None: never) and the policy then (rule 17)
    front_timeout_ms: int | None = None
    dead_fronts: str = "wait"
    #: each sink's windows of sla_window_ms are late sla_ms after their end (None: off)
    sla_ms: int | None = None
    sla_window_ms: int = 1_000
    #: how long a window's hold waits for the tracker before its query stops
    hold_wait_s: float = HOLD_WAIT_S

    def __post_init__(self) -> None:
        if not self.hold_wait_s > 0:
            raise PipelineShapeError(f"hold_wait_s must be > 0 s, got {self.hold_wait_s} "
                                     "(e.g. hold_wait_s=30)")

    def embedded_kwargs(self) -> dict[str, Any]:
        """``TrackerService.start``'s keyword arguments for an embedded tracker."""
        return {
            "state_dir": self.state_dir,
            "secret": self.secret.encode() if self.secret is not None else None,
            "freeze_gc": self.freeze_gc,
            "pipeline": self.pipeline,
            "stuck_after_ms": self.stuck_after_ms,
            "web_port": self.web_port,
            "front_timeout_ms": self.front_timeout_ms,
            "dead_fronts": self.dead_fronts,
            "sla_ms": self.sla_ms,
            "sla_window_ms": self.sla_window_ms,
        }


def operating_options(front_timeout: str | int | None, dead_fronts: str,
                      sla: str | int | None, sla_window: str | int) -> dict[str, Any]:
    """``TrackerOptions``' operating fields from a pipeline's ``front_timeout``
    (``"30 seconds"`` or ms; None: fronts never die), ``dead_fronts`` policy, ``sla``
    (None: none) and ``sla_window``, refused here with the fix when they make no sense."""
    timeout_ms = None if front_timeout is None else duration_of(front_timeout, "front_timeout")
    sla_ms = None if sla is None else duration_of(sla, "sla")
    window_ms = duration_of(sla_window, "sla_window")
    try:
        FrontTimeout(1 if timeout_ms is None else timeout_ms, dead_fronts)
        Sla(1 if sla_ms is None else sla_ms, window_ms)
    except ValueError as err:
        raise PipelineShapeError(f"{err} (e.g. front_timeout='30 seconds', "
                                 "dead_fronts='retire', sla='1 minute')") from None
    return {"front_timeout_ms": timeout_ms, "dead_fronts": dead_fronts, "sla_ms": sla_ms,
            "sla_window_ms": window_ms}


class TrackerHandle:
    """The tracker a pipeline reports to: embedded (started here) or remote."""

    def __init__(self, graph: SegmentGraph, grid: TimeGrid,
                 options: TrackerOptions | None = None) -> None:
        options = options or TrackerOptions()
        self.graph, self.grid, self.secret = graph, grid, options.secret
        self.service: Any = None
        url = options.url
        if url is None:
            from lowtide.service import TrackerService

            self.service = TrackerService.start(graph, grid=grid, **options.embedded_kwargs())
            url = self.service.url
        self.url: str = url
        self.ref = TrackerRef(self.url, graph, grid, options.secret, options.confirm,
                              options.hold_wait_s)
        self._agent: Any = None

    def attach(self, part: SegmentGraph) -> None:
        """Attach the segments of ``part`` (another query's graph) that the tracker
        lacks, on the running tracker (rule 16): the queries running keep going, and
        the tasks of the queries built from now on use the new generation's graph."""
        from lowtide.core.errors import GraphError

        missing = [part.spec(s) for s in range(len(part)) if part.names[s] not in self.graph]
        try:
            self.graph = self.agent.change_graph(attach=missing)
        except GraphError as err:
            raise PipelineShapeError(f"this query cannot join the running tracker: {err} "
                                     "(name its steps apart from the running queries')") from None
        self.ref = replace(self.ref, graph=self.graph)

    def detach(self, names: list[str], released: Sequence[str] = ()) -> list[str]:
        """Detach segments from the running tracker (rule 16); returns its report of
        each one's items still in flight. ``released``: ingest segments whose log
        consumer was released; their fronts leave them first (up to ``FRONTS_LEAVE_S``),
        so no front sends into a detached segment (it would be refused)."""
        self._wait_fronts_left(list(released))
        self.graph = self.agent.change_graph(detach=names)
        self.ref = replace(self.ref, graph=self.graph)
        reports: list[str] = self.status()["generations"][-1]["detached"]
        return reports

    def _wait_fronts_left(self, segments: list[str]) -> None:
        deadline = time.monotonic() + FRONTS_LEAVE_S
        while segments and time.monotonic() < deadline:
            fronts = self.status()["fronts"].values()
            if not any(segment in segments for segment, *_rest in fronts):
                return
            time.sleep(0.05)

    @property
    def web_url(self) -> str | None:
        """The embedded tracker's web view (the login link when a secret is set)."""
        return self.service.web_url if self.service is not None else None

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
            self._agent.close()
            self._agent = None
        if self.service is not None:
            self.service.stop()
            self.service = None
