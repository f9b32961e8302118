"""The standalone tracker, ``lowtide serve``: options, the server's run loop, and the
entry point shard processes start (``python -m lowtide.service.deploy.standalone``), which
imports only the service (pyspark takes seconds to import and would slow every restart).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service import logs
from lowtide.service.auth import load_secret
from lowtide.service.channel import MAX_PORT
from lowtide.service.deploy.cluster import ShardProcesses
from lowtide.service.ha.config import HaConfig
from lowtide.service.net import Limits
from lowtide.service.persistence.state_dir import StateDirError
from lowtide.service.server.config import ServerConfig
from lowtide.service.server.tracker_server import TrackerServer
from lowtide.wire.messages import segment_of


def add_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    serve.add_argument("--port", type=port_number, default=7433, help="0 picks a free port")
    serve.add_argument("--graph", type=Path, help=GRAPH_FORMAT)
    serve.add_argument("--delta-ms", type=int, default=10)
    serve.add_argument("--window-slots", type=int, default=1)
    serve.add_argument("--state-dir", type=Path, help="write-ahead log and snapshots")
    serve.add_argument("--fsync", action="store_true", help="fsync the log before confirming")
    serve.add_argument("--snapshot-every-s", type=float, default=30.0)
    serve.add_argument("--secret-file", type=Path, help="shared secret (else $LOWTIDE_SECRET)")
    serve.add_argument(
        "--metrics-port", type=port_number, help="serve Prometheus metrics over HTTP"
    )
    serve.add_argument(
        "--metrics-host", default="127.0.0.1", help="metrics bind address (default loopback)"
    )
    serve.add_argument(
        "--web-port", type=port_number,
        help="serve the web view (a live page of the segment graph) over HTTP; 0 picks a port",
    )
    serve.add_argument(
        "--web-host", default="127.0.0.1",
        help="web view bind address (default loopback; another needs the secret)",
    )
    serve.add_argument(
        "--pipeline", default="default", help="the pipeline label of the metrics and web view"
    )
    limits = Limits()
    serve.add_argument("--max-connections", type=int, default=limits.max_connections)
    serve.add_argument(
        "--idle-timeout-s",
        type=float,
        default=limits.idle_timeout_s,
        help="drop a peer silent this long (clients send keepalives)",
    )
    serve.add_argument("--stuck-after-ms", type=int, default=5_000)
    serve.add_argument(
        "--front-timeout-s", type=float,
        help="a live front silent this long is dead (default: never); see --dead-fronts",
    )
    serve.add_argument(
        "--dead-fronts", choices=("wait", "retire"), default="wait",
        help="a dead front: wait for it and say so, or retire it so the rest progresses",
    )
    serve.add_argument(
        "--sla-s", type=float,
        help="a sink window is late this long after its end: logged, counted, in the status",
    )
    serve.add_argument("--sla-window-s", type=float, default=1.0,
                       help="the sink windows the SLA applies to (default 1 s)")
    serve.add_argument(
        "--ha", metavar="kafka://HOST:PORT/GROUP",
        help="run in a group of trackers sharing a step log in Kafka: stand by, lead once "
             "the leader is silent for --lease-s (start one per machine, same GROUP)",
    )
    serve.add_argument("--lease-s", type=float, default=3.0,
                       help="a leader silent this long is taken over (with --ha)")
    serve.add_argument("--shards", type=int, default=0, help="run N shard processes")
    serve.add_argument("--shard", help=argparse.SUPPRESS)  # K/N: run as shard K of N
    serve.add_argument("--watch-stdin", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument("--log-format", choices=("json", "text"), default="json")
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(handler=run_serve)


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 for a free one."""
    if not text.isdigit() or int(text) > MAX_PORT:
        raise argparse.ArgumentTypeError(f"a port is 0-{MAX_PORT} (0 picks a free one)")
    return int(text)


GRAPH_FORMAT = ('JSON [["segment", ["inbound", ...]], ...], a segment split into key ranges '
                '["segment", ["inbound", ...], N, [[front, [range, ...]], ...]]')


def read_graph(path: Path) -> SegmentGraph:
    """The ``--graph`` file; any fault is a ValueError whose message says the fix."""
    try:
        spec = json.loads(path.read_text())
        return SegmentGraph.of(*(segment_of(entry) for entry in spec))
    except OSError as exc:
        raise ValueError(f"cannot read --graph {path}: {exc.strerror}") from exc
    except (ValueError, TypeError) as exc:  # not JSON, not pairs, or not a valid graph
        raise ValueError(f"--graph {path} is not a graph ({exc}); write {GRAPH_FORMAT}") from exc


def shard_args(args: argparse.Namespace) -> list[str]:
    """The options a coordinator passes on to its shards."""
    out = ["--host", args.host, "--delta-ms", str(args.delta_ms)]
    out += ["--window-slots", str(args.window_slots), "--stuck-after-ms", str(args.stuck_after_ms)]
    out += ["--snapshot-every-s", str(args.snapshot_every_s), "--log-format", args.log_format]
    out += ["--log-level", args.log_level, "--max-connections", str(args.max_connections)]
    out += ["--idle-timeout-s", str(args.idle_timeout_s)]
    if args.graph:
        out += ["--graph", str(args.graph)]
    if args.secret_file:
        out += ["--secret-file", str(args.secret_file)]
    if args.fsync:
        out.append("--fsync")
    return out


def server_config(args: argparse.Namespace, shard_urls: tuple[str, ...] = ()) -> ServerConfig:
    shard = None
    if args.shard:
        index, count = args.shard.split("/")
        shard = (int(index), int(count))
    return ServerConfig(
        graph=read_graph(args.graph) if args.graph else None,
        grid=TimeGrid(args.delta_ms, args.window_slots),
        host=args.host,
        port=args.port,
        state_dir=args.state_dir,
        fsync=args.fsync,
        snapshot_every_ms=int(args.snapshot_every_s * 1000),
        secret=load_secret(args.secret_file),
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        web_port=args.web_port,  # not passed on to shards: the coordinator's view covers all
        web_host=args.web_host,
        pipeline=args.pipeline,
        limits=Limits(max_connections=args.max_connections, idle_timeout_s=args.idle_timeout_s),
        stuck_after_ms=args.stuck_after_ms,
        front_timeout_ms=None if args.front_timeout_s is None else int(args.front_timeout_s * 1000),
        dead_fronts=args.dead_fronts,
        sla_ms=None if args.sla_s is None else int(args.sla_s * 1000),
        sla_window_ms=int(args.sla_window_s * 1000),
        shard=shard,
        shard_urls=shard_urls,
        ha=None if args.ha is None else HaConfig.parse(args.ha, int(args.lease_s * 1000)),
        name=f"shard-{shard[0]}" if shard else "lowtide",
    )


def run_serve(args: argparse.Namespace) -> int:
    try:
        server_config(args)  # refuse bad options before starting any process
    except ValueError as exc:
        print(f"lowtide serve: {exc}", file=sys.stderr)
        return 2
    logs.setup(args.log_format, args.log_level)
    try:
        lost = asyncio.run(_serve(args))
    except StateDirError as exc:
        print(f"lowtide serve: {exc}", file=sys.stderr)
        return exc.exit_code
    except ValueError as exc:  # a file limit too small for the tracker
        print(f"lowtide serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"lowtide serve: {why_not_serving(args, exc)}", file=sys.stderr)
        return 1
    if lost:  # a group's tracker that stopped leading (or never could): say why
        print(f"lowtide serve: stopped leading: {lost}", file=sys.stderr)
        return 4
    return 0


def why_not_serving(args: argparse.Namespace, exc: OSError) -> str:
    if exc.filename is not None:  # in the state dir (the secret file was read before)
        return f"{exc.filename}: {exc.strerror}; pick another --state-dir or fix its permissions"
    return (  # the address: taken, not this host's, or privileged
        f"cannot listen on {args.host}:{args.port}: {exc.strerror}; "
        "pick another --host/--port (--port 0 picks a free one)"
    )


async def _serve(args: argparse.Namespace) -> str:
    """Serve until stopped; returns why it stopped leading, if it did (``--ha``)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.watch_stdin:  # a daemon thread: it must not keep the process alive
        threading.Thread(target=_wait_for_eof, args=(loop, stop), daemon=True).start()
    shards = None
    if args.shards > 0:
        shards = ShardProcesses(args.shards, shard_args(args), args.state_dir)
        config = server_config(args, await shards.start())
        config = replace(config, state_dir=None)  # the shards keep the state
    else:
        config = server_config(args)
    server = config.build()
    await server.start()
    if shards is not None:
        shards.on_moved = server.move_shard
    if config.ha is not None:
        print(f"lowtide standby {config.ha.url}", flush=True)
        await first_of(stop, server.leading, server.ended)
    if server.leading.is_set():
        _announce(config, server)
    await first_of(stop, server.ended)
    await server.stop()
    if shards is not None:
        await shards.stop()
    return server.lost


async def first_of(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    _done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for wait in pending:
        wait.cancel()


def _announce(config: ServerConfig, server: TrackerServer) -> None:
    print(f"lowtide serving {server.url}", flush=True)
    if server.metrics_port:
        host = config.metrics_host
        print(f"lowtide metrics http://{host}:{server.metrics_port}/metrics", flush=True)
    if server.web_url:  # with a secret a login link, as Jupyter prints one
        print(f"lowtide web {server.web_url}", flush=True)


def _wait_for_eof(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Block until stdin closes (the parent is gone), then ask the server to stop.
    Raw reads: a daemon thread inside sys.stdin's buffer would abort interpreter exit."""
    while os.read(0, 4096):
        pass
    loop.call_soon_threadsafe(stop.set)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lowtide.service.deploy.standalone")
    add_arguments(parser)
    return run_serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
