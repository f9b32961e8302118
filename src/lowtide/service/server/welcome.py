"""The server's side of a handshake's last step: the Welcome to a client's Hello,
or why not (wire version, graph, time grid, shard). Runs in the state task."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lowtide.core.generations import follows
from lowtide.core.graph import SegmentGraph
from lowtide.service.engine.base import Engine
from lowtide.service.errors import ServiceError
from lowtide.service.handshake import shard_mismatch
from lowtide.wire.messages import WIRE_VERSION, ErrorCode, Hello, Welcome, graph_spec

if TYPE_CHECKING:
    from lowtide.service.server.config import ServerConfig


def check_version(hello: Hello) -> None:
    if hello.version != WIRE_VERSION:
        raise ServiceError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"wire version {hello.version}, server speaks {WIRE_VERSION}",
        )


def welcome(hello: Hello, graph: SegmentGraph | None, engine: Engine,
            cfg: ServerConfig) -> Welcome:
    """The Welcome for a client of ``graph`` (None: it takes the tracker's), or the
    refusal that says what to change."""
    # a client of an earlier generation keeps its indices in every later one (rule 16)
    if graph is not None and graph != engine.graph and not follows(graph, engine.graph):
        raise ServiceError(
            ErrorCode.GRAPH_MISMATCH,
            f"client graph {graph.fingerprint()} ({len(graph)} segments) differs from "
            f"the tracker's {engine.graph.fingerprint()} ({len(engine.graph)})",
        )
    grid = (cfg.grid.delta_ms, cfg.grid.window_slots)
    if hello.grid is not None and hello.grid != grid:
        raise ServiceError(ErrorCode.GRID_MISMATCH,
                           f"this tracker's grid is delta_ms {grid[0]}, window_slots "
                           f"{grid[1]}; the client expects {hello.grid[0]}, "
                           f"{hello.grid[1]}: use the tracker's grid")
    wrong_shard = shard_mismatch(hello.role, hello.shard, cfg.shard)
    if wrong_shard is not None:
        raise ServiceError(ErrorCode.SHARD_MISMATCH, wrong_shard)
    mine = graph_spec(engine.graph)
    return Welcome(WIRE_VERSION, cfg.name, mine, *grid, engine.shards, cfg.shard)
