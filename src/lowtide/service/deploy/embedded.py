"""A tracker server inside the current process (the driver, by default).

The server runs on an event loop of its own, on a background thread, so that the
driver's code (and Spark's) never has to be asynchronous. It still listens on a real
loopback socket, because executors are other processes; code in this process can
reach it without a socket through :attr:`TrackerService.inproc_url`.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from pathlib import Path
from typing import Any

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service.client.agent import Agent
from lowtide.service.client.base_agent import close_shared
from lowtide.service.server.config import ServerConfig
from lowtide.service.server.tracker_server import TrackerServer

DEFAULT_GRID = TimeGrid()


def freeze_long_lived() -> None:
    """``gc.freeze()`` what is alive now, once per process (skipped if anything is
    frozen already). The server's thread shares this process's interpreter: a full
    collection over a PySpark driver's objects stalls it, and every notification with
    it, 35-129 ms (measured); afterwards full collections skip what is frozen. Garbage
    is collected first, since frozen cycles are never freed, and only the first call
    freezes, so what later work leaves behind stays collectable."""
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()


class TrackerService:
    def __init__(
        self, server: TrackerServer, loop: asyncio.AbstractEventLoop, thread: threading.Thread
    ) -> None:
        self.server = server
        self._loop = loop
        self._thread = thread

    @classmethod
    def start(
        cls,
        graph: SegmentGraph | None,
        *,
        grid: TimeGrid = DEFAULT_GRID,
        state_dir: str | Path | None = None,
        secret: bytes | None = None,
        freeze_gc: bool = True,
        **options: Any,
    ) -> TrackerService:
        """Start a server (see :class:`ServerConfig` for ``options``) and return once
        it accepts connections. ``freeze_gc``: see :func:`freeze_long_lived`."""
        config = ServerConfig(
            graph=graph,
            grid=grid,
            state_dir=Path(state_dir) if state_dir is not None else None,
            secret=secret,
            **options,
        )
        return cls.run(config, freeze_gc)

    @classmethod
    def run(cls, config: ServerConfig, freeze_gc: bool = True) -> TrackerService:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="lowtide-tracker", daemon=True)
        thread.start()
        server = config.build()
        try:
            asyncio.run_coroutine_threadsafe(server.start(), loop).result()
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            raise
        if freeze_gc:
            freeze_long_lived()
        return cls(server, loop, thread)

    @property
    def url(self) -> str:
        """``tcp://127.0.0.1:PORT`` for executors (``inproc://`` if not listening)."""
        return self.server.url

    @property
    def web_url(self) -> str | None:
        """The web view (``web_port=0`` or a port: opt-in; None when off): open it in a
        browser. With a secret it is the login link, so treat it as one."""
        return self.server.web_url

    @property
    def inproc_url(self) -> str:
        return self.server.inproc_url

    @property
    def config(self) -> ServerConfig:
        return self.server.config

    def agent(self, **options: Any) -> Agent:
        """An agent for this process that skips the socket."""
        graph = self.server.engine.graph if self.server.engine else self.config.graph
        if graph is None:
            raise RuntimeError("the tracker has no pipeline graph yet")
        return Agent.connect(self.inproc_url, graph, secret=self.config.secret, **options)

    def status(self) -> dict[str, object]:
        body: dict[str, object] = self.call(self.server.status)
        return body

    def call(self, fn: Any) -> Any:
        """Run ``fn()`` on the server's loop (where its state lives) and return the result."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result()

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        # first, while the server still answers their flush (see close_shared)
        for url in {self.url, self.inproc_url}:
            close_shared(url)
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> TrackerService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
