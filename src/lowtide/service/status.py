"""`lowtide status`: a live table of a tracker's segments, from any server role."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Callable
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from lowtide.service.auth import nonce
from lowtide.service.errors import exception_of
from lowtide.service.lane import Lane, LaneConfig, Reply
from lowtide.wire.messages import WIRE_VERSION, Error, Hello, Role, Status, StatusRequest


async def poll_status(
    url: str,
    lane_config: LaneConfig,
    on_status: Callable[[dict[str, Any] | None], bool],
    interval_s: float,
    timeout_s: float,
) -> None:
    """Fetch the status every ``interval_s``; ``on_status`` gets it (None while the
    server does not answer) and returns whether to go on."""

    def hello() -> Hello:
        return Hello(WIRE_VERSION, Role.STATUS, nonce(), f"status-{os.getpid()}", None)

    lane = Lane(url, hello, lane_config, lambda _w: None, lambda _m: None)
    lane.start()
    try:
        for req in itertools.count(1):
            fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
            lane.submit(req, StatusRequest(req), fut)
            try:
                reply = await asyncio.wait_for(fut, timeout_s)
            except TimeoutError:
                reply = None
            if isinstance(reply, Error):
                raise exception_of(reply)
            body = json.loads(reply.json) if isinstance(reply, Status) else None
            if not on_status(body):
                return
            await asyncio.sleep(interval_s)
    finally:
        await lane.close()


def render(status: dict[str, Any] | None, url: str) -> RenderableType:
    if status is None:
        return Text(f"{url}: no answer (retrying)", style="bold red")
    delta = int(status.get("delta_ms", 10))
    now = int(status.get("now_ms", 0))
    title = (
        f"{status.get('server')} {status.get('url')}  global min {status.get('global_min')}"
        f"  acks {status.get('acks_applied')}  dedup hits {status.get('dedup_hits')}"
        f"  connections {status.get('connections')}"
    )
    table = Table(title=title, title_justify="left")
    for column in ("segment", "min time", "lag ms", "bound", "open windows", "in flight"):
        table.add_column(column, justify="left" if column == "segment" else "right")
    for seg in status.get("segments", []):
        lag = now - seg["min_time"] * delta
        table.add_row(
            seg["segment"],
            str(seg["min_time"]),
            f"{lag:,}",
            str(seg["bound"]),
            str(seg["open_windows"]),
            str(seg["in_flight"]),
        )
    parts: list[RenderableType] = [table]
    for shard in status.get("shards", []):
        state = "up" if shard["connected"] else "DOWN"
        shard_min = (shard.get("status") or {}).get("global_min", "?")
        parts.append(Text(f"shard {shard['url']}: {state}, local min {shard_min}"))
    for stuck in status.get("stuck", []):
        parts.append(Text(f"stuck: {stuck}", style="bold yellow"))
    return Group(*parts)
