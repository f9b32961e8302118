"""`lowtide serve --shards N`: N shard processes under one coordinator process.

The coordinator starts each shard as ``lowtide serve --shard K/N`` on a free port,
restarts a shard that dies on the same port and state directory (agents and the
coordinator reconnect and resend; the shard recovers from its log), and stops them
all when it stops. Shards exit by themselves when the coordinator disappears, even
by ``kill -9``: they watch their stdin, a pipe only the coordinator holds.

A dead shard's port may be taken by another process before the shard is back. Then
the shard starts on another port and ``on_moved`` tells the coordinator, which
watches it there and makes every client reconnect to learn the new address. Whoever
holds the old port is never believed meanwhile: clients ask for "shard K of N" of
their graph and grid in their Hello (covered by the secret's proofs) and refuse any
other answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from lowtide.service.persistence.state_dir import StateDirRefused

log = logging.getLogger("lowtide.service.cluster")

START_TIMEOUT_S = 30.0
#: Tries on a dead shard's own port before it moves to another.
SAME_PORT_TRIES = 5
#: Tries on a free port (a previous shard may still hold the state dir while it exits).
FREE_PORT_TRIES = 50


class ShardProcesses:
    def __init__(self, count: int, args: list[str], state_dir: Path | None) -> None:
        """``args``: `lowtide serve` options every shard shares (graph, grid, host...)."""
        self.count = count
        self._args = args
        self._state_dir = state_dir
        self._procs: list[asyncio.subprocess.Process | None] = [None] * count
        self.urls: list[str] = [""] * count
        self._watch: asyncio.Task[None] | None = None
        #: called with (shard, url) when a restarted shard had to take another port
        self.on_moved: Callable[[int, str], None] = lambda _k, _url: None

    async def start(self) -> tuple[str, ...]:
        for k in range(self.count):
            await self._restart(k, port=0)  # retries: a previous shard may still be exiting
        self._watch = asyncio.get_running_loop().create_task(self._supervise())
        return tuple(self.urls)

    def _command(self, k: int, port: int) -> list[str]:
        cmd = [sys.executable, "-m", "lowtide.service.deploy.standalone", *self._args]
        cmd += ["--shard", f"{k}/{self.count}", "--port", str(port), "--watch-stdin"]
        if self._state_dir is not None:
            cmd += ["--state-dir", str(self._state_dir / f"shard-{k}")]
        return cmd

    async def _spawn(self, k: int, port: int) -> None:
        proc = await asyncio.create_subprocess_exec(
            *self._command(k, port), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
        text = line.decode().strip()
        if not text.startswith("lowtide serving "):
            if proc.returncode is None:
                proc.kill()
            if await proc.wait() == StateDirRefused.exit_code:
                raise StateDirRefused(f"shard {k} refuses to start from its state dir (it said "
                                      "why above); retrying cannot help")
            raise RuntimeError(f"shard {k} did not start: {text!r}")
        self._procs[k] = proc
        self.urls[k] = text.split()[-1]
        log.info("shard started", extra={"shard": k, "url": self.urls[k], "pid": proc.pid})

    async def _supervise(self) -> None:
        while True:
            waits = {asyncio.ensure_future(p.wait()): k for k, p in enumerate(self._procs) if p}
            done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for fut in pending:
                fut.cancel()
            for fut in done:
                k = waits[fut]
                log.warning("shard died; restarting", extra={"shard": k, "code": fut.result()})
                port = int(self.urls[k].rsplit(":", 1)[1])
                try:
                    await self._restart(k, port)
                except (RuntimeError, StateDirRefused) as exc:  # never a silent dead watch
                    log.critical("shard cannot be restarted: its min times stay where they "
                                 "are; stop the tracker and see the shard's log above",
                                 extra={"shard": k, "error": str(exc)})
                    self._procs[k] = None
            if not any(self._procs):
                return

    async def _restart(self, k: int, port: int) -> None:
        """Start shard ``k`` on ``port`` (0: a free one); if its own port stays taken,
        on another, and tell :attr:`on_moved`."""
        if port and await self._tries(k, port, SAME_PORT_TRIES):
            return
        if not await self._tries(k, 0, FREE_PORT_TRIES):
            raise RuntimeError(f"shard {k} cannot be restarted")
        if port:
            log.warning("shard port taken by another process: shard moved",
                        extra={"shard": k, "port": port, "url": self.urls[k],
                               "fix": "find what took the port; clients follow the shard"})
            self.on_moved(k, self.urls[k])

    async def _tries(self, k: int, port: int, tries: int) -> bool:
        for attempt in range(tries):
            try:
                await self._spawn(k, port)
                return True
            except StateDirRefused:
                raise
            except (RuntimeError, TimeoutError) as exc:  # port or state dir still held
                log.warning(
                    "shard restart failed", extra={"shard": k, "try": attempt, "error": str(exc)}
                )
                await asyncio.sleep(0.2)
        return False

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        for proc in self._procs:
            if proc is not None and proc.returncode is None:
                proc.terminate()
        for proc in self._procs:
            if proc is None:
                continue
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
