"""``lowtide spark class-archive``: write the driver JVM's class archive (Java's AppCDS)
that every later session starts from (``make setup`` runs it).

A session's driver JVM loads and verifies some 17,000 classes from Spark's jars while it
starts and plans its first query: most of the 5 s a session takes on 2 cores, and part
of each first micro-batch. This command runs the demo's two queries (lowtide's exact
window, Spark's watermark window) for a few micro-batches in a JVM started with
``-XX:ArchiveClassesAtExit``; the JVM writes every class it loaded to
``jars/spark/lib/lowtide-classes.jsa`` (:func:`~lowtide.spark.class_archive_path`) as
it exits, and :class:`~lowtide.spark.SessionConfig` maps it into each later driver
(``-XX:SharedArchiveFile``). The archive holds what this JDK and these jars gave: run it
again after either changes (``make setup`` does); a stale archive is skipped by the
JVM, never wrong.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

#: micro-batches each query runs: planning, state stores and the sinks' commits load
#: their classes in the first few
TRAINING_BATCHES = 3
EXIT_WAIT_S = 120.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from lowtide.spark import class_archive_path

    target = class_archive_path()
    if not target.parent.is_dir():
        print(f"lowtide: no jars folder at {target.parent}: run `make setup` first")
        return 1
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    print("lowtide: writing the driver JVM's class archive from a short run of the "
          "demo's queries (about 40 s) ...", flush=True)
    started = time.monotonic()
    try:
        _train(partial)
        written = partial.is_file()
        if written:
            partial.replace(target)
    except Exception as err:  # the archive only makes sessions start sooner: go on
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        print(f"lowtide: no class archive written ({first}); sessions start without one")
        return 0
    finally:
        partial.unlink(missing_ok=True)
    if not written:
        print("lowtide: this JVM wrote no class archive; sessions start without one")
        return 0
    print(f"lowtide: wrote {target} ({target.stat().st_size / 1e6:.0f} MB) in "
          f"{time.monotonic() - started:.0f} s", flush=True)
    return 0


def _train(archive: Path) -> None:
    """Run the demo's queries for a few micro-batches in a JVM that writes ``archive``
    as it exits; returns once it has exited."""
    from pyspark import SparkContext

    from lowtide.spark import SessionConfig, write_archive_options

    config = SessionConfig(app_name="lowtide-class-archive", class_archive=False,
                           driver_java_options=write_archive_options(archive))
    try:
        spark = config.build()
        try:
            _run_queries(spark)
        finally:
            spark.stop()
    finally:
        _exit_jvm(SparkContext._gateway)


def _run_queries(spark: Any) -> None:
    from lowtide.apps import demo
    from lowtide.apps.startup import prepare
    from lowtide.service import wall_ms
    from lowtide.spark import stop_between_batches

    tmp = tempfile.mkdtemp(prefix="lowtide-class-archive-")
    try:
        prepare(spark)
        spec = demo.demo_spec(2, 200.0, 0, wall_ms(), spark.sparkContext.defaultParallelism)
        pipe, lt = demo.start_lowtide(spark, spec, f"{tmp}/lt_out", f"{tmp}/lt_ckpt")
        wm = demo.start_watermark(spark, spec, f"{tmp}/wm_out", f"{tmp}/wm_ckpt", 1_000)
        try:
            _wait_batches([lt.query, wm])
        finally:  # between micro-batches: a batch cut short logs Spark's errors
            lt.stop()
            stop_between_batches(wm)
            pipe.close()
        spark.read.parquet(f"{tmp}/wm_out").count()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_batches(queries: list[Any], timeout_s: float = 300.0) -> None:
    from lowtide.apps.startup import raise_if_failed

    deadline = time.monotonic() + timeout_s
    while any(len(q.recentProgress) < TRAINING_BATCHES for q in queries):
        raise_if_failed(queries)
        if time.monotonic() > deadline:
            raise RuntimeError(f"the training queries did not run within {timeout_s:.0f} s")
        time.sleep(0.5)


def _exit_jvm(gateway: Any) -> None:
    """End pyspark's JVM as a Python driver's exit would (its stdin closes: it exits,
    writing the archive first), and wait for it."""
    proc = getattr(gateway, "proc", None)
    if proc is None:  # no JVM, or one this process did not start: nothing to wait for
        return
    gateway.shutdown()
    if proc.stdin is not None:
        proc.stdin.close()
    proc.wait(timeout=EXIT_WAIT_S)
