"""A tracker's role in a group (rule 18): standby until the leader falls silent, then
leader until fenced. The server asks :meth:`TrackerRole.lead` before it listens."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from lowtide.core.graph import SegmentGraph
from lowtide.service.engine.base import Engine
from lowtide.service.ha.config import HaConfig
from lowtide.service.ha.leader_log import LeaderLog
from lowtide.service.ha.standby import Standby

log = logging.getLogger("lowtide.service.ha")


class TrackerRole:
    def __init__(self, config: HaConfig, build: Callable[[SegmentGraph], Engine]) -> None:
        self.config = config
        self._build = build
        self.role = "standby"
        self.epoch = 0
        self.log: LeaderLog | None = None
        self._engine: Engine | None = None  # the followed engine, until the server adopts it
        self._groups = 0
        self._stop = threading.Event()

    async def lead(self, now_ms: Callable[[], int]) -> LeaderLog | None:
        """Follow the log until this tracker leads (its log) or :meth:`stop` (None).
        Raises LeadLost if the log is unreachable or another standby won."""
        loop = asyncio.get_running_loop()
        producer = await loop.run_in_executor(None, self._follow_then_fence)
        if producer is None:
            return None
        self.log = LeaderLog(self.config, producer, self.epoch, now_ms())
        self.role = "leader"
        log.info("leading", extra={"log": self.config.url, "epoch": self.epoch,
                                   "groups_replayed": self._groups})
        return self.log

    def _follow_then_fence(self) -> Any | None:
        """On a worker thread: librdkafka's calls block."""
        standby = Standby(self.config, self._build)
        log.info("standby", extra={"log": self.config.url, "lease_ms": self.config.lease_ms})
        try:
            if not standby.follow(self._stop):
                return None
            producer = standby.take_over()
        finally:
            standby.close()
        self._engine, self.epoch, self._groups = standby.engine, standby.epoch + 1, standby.groups
        return producer

    @property
    def graph(self) -> SegmentGraph | None:
        """The graph the log holds (None: none yet; the first client's is adopted)."""
        return None if self._engine is None else self._engine.graph

    def engine(self, graph: SegmentGraph, now_ms: int) -> Engine:
        """The engine to serve: the one the log made, else a new one for ``graph``
        (logged as generation 0 before anything uses it)."""
        assert self.log is not None, "lead() first"
        engine = self._engine
        if engine is None:
            engine = self._build(graph)
            self.log.log_graph(graph, now_ms)
        self._engine = None
        engine.on_refused = self.log.append  # refusals are logged, as in a state dir
        return engine

    def stop(self) -> None:
        self._stop.set()
        if self.log is not None:
            self.log.close()

    def document(self) -> dict[str, object]:
        """For the status: this tracker's role, the leader epoch, the log."""
        return {"role": self.role, "epoch": self.epoch, "log": self.config.url}
