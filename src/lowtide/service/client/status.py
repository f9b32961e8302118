"""`lowtide status`: a live table of a tracker's segments, from any server role.

Per segment: min time, lag behind the wall clock, rows/s (from the tracker's own
``received`` totals between polls), rows received and sent; then the fronts, with the
stalled ones named. Rates and stalls come from :mod:`lowtide.service.progress`, which
the Spark layer's progress view shares.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from lowtide.core.errors import ProtocolError
from lowtide.service.auth import load_secret, nonce
from lowtide.service.channel import tracker_urls
from lowtide.service.client.connection import ConnectionConfig, Reply, ServerConnection
from lowtide.service.errors import ConnectionLost, ServiceError, exception_of
from lowtide.service.progress import (
    RowRates,
    doc_grid,
    late_lines,
    open_ends,
    stalled_fronts,
)
from lowtide.wire.messages import WIRE_VERSION, Error, Hello, Role, Status, StatusRequest


@dataclass(frozen=True)
class NoAnswer:
    """What a status poll shows while the server does not answer, and why."""

    url: str
    reason: str  # "refused", "timed out", "unknown host", "connected, no reply yet", ...

    def line(self) -> str:
        return f"connecting to {self.url} ({self.reason}), retrying"

    def gave_up(self, prog: str) -> str:
        """The one line of a command that asked once."""
        return (f"{prog}: no answer from {self.url} ({self.reason}); start `lowtide serve` "
                "(or the pipeline) there, or pass --url")


def why_no_answer(conn: ServerConnection) -> str:
    if conn.connected.is_set():
        return "connected, no reply yet"
    failure = conn.last_failure
    cause = failure.__cause__ if failure is not None and failure.__cause__ else failure
    if cause is None:
        return "no connection yet"
    if isinstance(cause, ConnectionRefusedError):
        return "refused"
    if isinstance(cause, TimeoutError):
        return "timed out"
    if isinstance(cause, socket.gaierror):
        return "unknown host"
    return str(cause) or type(cause).__name__


def answer_wait_s(interval_s: float) -> float:
    """How long a live view waits for an answer before it says why there is none:
    its refresh period, within [0.5, 5] s, so a server that is down shows at once."""
    return min(5.0, max(interval_s, 0.5))


#: Why no answer can come by waiting longer: nobody listens there, or no such host.
FINAL_REASONS = ("refused", "unknown host")


async def answer_within(
    pending: asyncio.Future[Reply], conn: ServerConnection, timeout_s: float, step_s: float = 0.1
) -> Reply | None:
    """``pending``'s reply within ``timeout_s``, else None; None at once when the
    tracker's only address refused the dial or names no host (``lowtide status
    --once`` against a tracker that is down answered after 5 s). A group's next
    address may lead (rule 18): it gets the whole ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    single = len(tracker_urls(conn.url)) == 1
    while True:
        left = deadline - loop.time()
        try:
            return await asyncio.wait_for(asyncio.shield(pending), min(left, step_s))
        except TimeoutError:
            if left <= step_s or (single and why_no_answer(conn) in FINAL_REASONS):
                return None


async def poll_status(
    url: str,
    config: ConnectionConfig,
    on_status: Callable[[dict[str, Any] | NoAnswer], bool],
    interval_s: float,
    timeout_s: float,
) -> None:
    """Fetch the status every ``interval_s``; ``on_status`` gets it (a
    :class:`NoAnswer` each ``timeout_s`` the server does not answer) and returns
    whether to go on. An unanswered request stays pending, so a slow server's late
    answer still counts."""

    def hello() -> Hello:
        return Hello(WIRE_VERSION, Role.STATUS, nonce(), f"status-{os.getpid()}", None)

    conn = ServerConnection(url, hello, config, lambda _w: None, lambda _m: None)
    conn.start()
    loop = asyncio.get_running_loop()
    pending: asyncio.Future[Reply] | None = None
    try:
        for req in itertools.count(1):
            if pending is None:
                pending = loop.create_future()
                conn.submit(req, StatusRequest(req), pending)
            asked = loop.time()
            reply = await answer_within(pending, conn, timeout_s)
            if reply is not None:
                pending = None
            if isinstance(reply, Error):
                raise exception_of(reply)
            if isinstance(reply, Status):
                body: dict[str, Any] | NoAnswer = json.loads(reply.json)
            else:
                body = NoAnswer(url, why_no_answer(conn))
            if not on_status(body):
                return
            # no answer: the next line after timeout_s, however soon this one came
            await asyncio.sleep(interval_s if reply is not None
                                else max(0.0, asked + timeout_s - loop.time()))
    finally:
        if pending is not None:  # nobody will read its failure when the connection closes
            pending.cancel()
        await conn.close()


def watch(
    prog: str,
    url: str,
    secret_file: Path | None,
    on_status: Callable[[dict[str, Any] | NoAnswer], bool],
    interval_s: float,
    timeout_s: float = 5.0,
) -> int:
    """:func:`poll_status` for a command: its exit code, and on failure one line on
    stderr saying why (a refused secret, a bad URL), never a traceback."""
    try:
        tracker_urls(url)  # a bad URL is the user's to fix, not a connection's to retry
        config = ConnectionConfig(secret=load_secret(secret_file), connect_timeout_s=timeout_s)
        asyncio.run(poll_status(url, config, on_status, interval_s, timeout_s))
    except ValueError as exc:  # the secret file or the URL
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except (ServiceError, ProtocolError, ConnectionLost) as exc:
        print(f"{prog}: {url}: {exc}", file=sys.stderr)
        return 1
    return 0


def render(
    status: dict[str, Any] | NoAnswer, rates: RowRates | None = None
) -> RenderableType:
    """The status as tables; ``rates`` (kept across polls) gives rows/s per segment
    from the ``received`` totals."""
    if isinstance(status, NoAnswer):
        return Text(status.line(), style="bold red")
    parts: list[RenderableType] = [_segments(status, rates or RowRates())]
    if status.get("fronts"):
        parts.append(_fronts(status))
    if "ha" in status:  # a tracker of a group (rule 18)
        ha = status["ha"]
        parts.append(Text(f"{ha['role']} of {ha['log']}, epoch {ha['epoch']}, pid "
                          f"{status.get('pid')}"))
    for shard in status.get("shards", []):
        state = "up" if shard["connected"] else "DOWN"
        shard_min = (shard.get("status") or {}).get("global_min", "?")
        parts.append(Text(f"shard {shard['url']}: {state}, local min {shard_min}"))
    for front, (segment, t, *_r) in sorted(status.get("fronts_declared", {}).items()):
        parts.append(Text(f"front {front} declared on {segment}, not registered: "
                          f"holds it at {t}", style="yellow"))
    events = status.get("front_events", {})
    if events.get("behind"):
        parts.append(Text(f"fronts refused as behind their segment: {events['behind']} "
                          "(a producer that started late, not declared)", style="bold red"))
    for event in events.get("recent", []):
        parts.append(Text(f"front: {event}", style="yellow"))
    for dead in status.get("fronts_dead", {}).values():
        parts.append(Text(f"waits for: {dead['text']}", style="bold red"))
    for waiting in status.get("waiting", []):
        parts.append(Text(f"waiting (not lost): {waiting}"))
    for stuck in status.get("stuck", []):
        parts.append(Text(f"stuck: {stuck}", style="bold yellow"))
    parts.extend(Text(f"open: {line}", style="bold yellow") for line in open_ends(status))
    parts.extend(Text(line, style="yellow") for line in late_lines(status))
    return Group(*parts)


def _segments(status: dict[str, Any], rates: RowRates) -> Table:
    grid = doc_grid(status)
    delta = grid.delta_ms
    now = int(status.get("now_ms", 0))
    title = (
        f"{status.get('server')} {status.get('url')}  global min {status.get('global_min')}"
        f"  acks {status.get('acks_applied')}  dedup hits {status.get('dedup_hits')}"
        f"  connections {status.get('connections')}"
    )
    table = Table(title=title, title_justify="left")
    columns = ("segment", "min time", "lag ms", "rows/s", "received", "sent", "bound")
    for column in (*columns, "open windows", "in flight"):
        table.add_column(column, justify="left" if column == "segment" else "right")
    for seg in status.get("segments", []):
        received = seg.get("received")
        rate = None if received is None else rates.observe(seg["segment"], now / 1000, received)
        table.add_row(
            seg["segment"],
            str(seg["min_time"]),
            "ended" if grid.at_end(seg["min_time"]) else f"{now - seg['min_time'] * delta:,}",
            "-" if rate is None else f"{rate:,.0f}",
            "-" if received is None else f"{received:,}",
            f"{seg['sent']:,}" if "sent" in seg else "-",
            str(seg["bound"]),
            str(seg["open_windows"]),
            str(seg["in_flight"]),
        )
        for r, t in enumerate(seg.get("key_ranges", [])):  # rule 15: a row per key range
            table.add_row(f"  {seg['segment']}#{r}", str(t), f"{now - t * delta:,}",
                          *("",) * 6)
    return table


def _fronts(status: dict[str, Any]) -> Table:
    grid = doc_grid(status)
    delta = grid.delta_ms
    now = int(status.get("now_ms", 0))
    fronts: dict[str, Any] = status["fronts"]
    stalled = set(stalled_fronts(fronts, now, grid))
    table = Table(title="fronts", title_justify="left")
    for column in ("front", "segment", "heartbeat", "heartbeat lag ms", "state"):
        table.add_column(column, justify="left" if column in ("segment", "state") else "right")
    for front, (segment, t) in sorted(fronts.items(), key=lambda kv: int(kv[0])):
        state = Text("STALLED", style="bold red") if int(front) in stalled else Text("ok")
        ended = grid.at_end(t)
        table.add_row(front, segment, "end" if ended else str(t),
                      "-" if ended else f"{now - t * delta:,}", Text("ended") if ended else state)
    return table
