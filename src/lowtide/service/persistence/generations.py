"""The state dir's graph generations (rule 16): which graph a tracker recovers, and
``generations.jsonl``, one line per change with its fingerprint.

``graph.json`` holds generation 0, the graph the state dir was started with; the
changes themselves are write-ahead log records (:class:`~lowtide.wire.messages.ChangeGraph`,
replayed in order like any request) and snapshots hold their generation's graph.
``generations.jsonl`` is the lasting record: a snapshot compacts the log, never it.
Recovery refuses a state dir whose generations are not consecutive, or disagree with
what replaying the log made, and a graph to serve that does not follow from the
generation it reached.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lowtide.core.generations import follows
from lowtide.core.graph import SegmentGraph
from lowtide.service.engine.base import Engine
from lowtide.service.persistence.state_dir import (
    open_private,
    refusal,
    store_graph,
    stored_graph,
    write_all,
)
from lowtide.service.persistence.state_log import StateLog

log = logging.getLogger("lowtide.service.persist")

GENERATIONS = "generations.jsonl"


def first_generation(state_dir: Path, graph: SegmentGraph) -> SegmentGraph:
    """The graph to build the engine with before recovery: the stored generation 0
    when ``graph`` is it or a later generation of it, else ``graph`` (a state dir of
    another graph is then refused by :func:`~.state_dir.store_graph`)."""
    stored = stored_graph(state_dir)
    return stored if stored is not None and follows(stored, graph) else graph


def read_generations(state_dir: Path) -> list[dict[str, Any]]:
    path = state_dir / GENERATIONS
    if not path.exists():
        return []
    lines = path.read_bytes().splitlines()
    try:
        found = [json.loads(line) for line in lines if line.strip()]
        numbers = [int(entry["generation"]) for entry in found]
    except (ValueError, KeyError, TypeError):
        raise refusal(path, 0, "damaged") from None
    if numbers != list(range(1, len(numbers) + 1)):
        raise refusal(path, 0, f"generations {numbers} are not 1, 2, 3, ... in order")
    return found


def check_recovered(state_dir: Path, generation: int, graph: SegmentGraph,
                    serve: SegmentGraph) -> None:
    """After recovery at ``generation`` (``graph``): refuse a record of generations
    that went further or elsewhere, and a graph to ``serve`` that ``graph`` does not
    follow from (an earlier generation's client is served the latest)."""
    logged = read_generations(state_dir)
    path = state_dir / GENERATIONS
    if len(logged) > generation:
        raise refusal(path, 0, f"records generation {len(logged)}, the log and snapshot "
                               f"reach {generation}")
    if logged and generation == len(logged) and logged[-1]["fingerprint"] != \
            graph.fingerprint():
        raise refusal(path, 0, f"generation {generation} is {logged[-1]['fingerprint']}, "
                               f"the log made {graph.fingerprint()}")
    if serve != graph and not follows(serve, graph):
        raise refusal(state_dir / "graph.json", 0,
                      f"this graph ({serve.fingerprint()}) does not follow from generation "
                      f"{generation} ({graph.fingerprint()}) of the state here: attach its "
                      "segments to the running tracker instead (lowtide.service.Agent."
                      "change_graph)")


def recover(build: Callable[[SegmentGraph], Engine], state_dir: Path, wal: StateLog,
            graph: SegmentGraph) -> Engine:
    """The engine recovered from ``state_dir``: built with its generation 0, the log
    replayed through every later one, ``graph`` (to serve) checked against it."""
    first = first_generation(state_dir, graph)
    engine = build(first)
    store_graph(state_dir, first)
    wal.recover(engine)
    check_recovered(state_dir, len(engine.generations), engine.graph, graph)
    return engine


def log_generations(state_dir: Path, engine: Engine, fsync: bool) -> None:
    """Append the generations ``generations.jsonl`` lacks (call once the write-ahead
    log holds their changes)."""
    for entry in engine.generations[len(read_generations(state_dir)):]:
        fd = open_private(state_dir / GENERATIONS, os.O_WRONLY | os.O_APPEND)
        try:
            write_all(fd, json.dumps(entry).encode() + b"\n")
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        log.info("graph generation", extra=entry)
