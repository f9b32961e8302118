"""A SparkSession with lowtide's defaults, and the JVM parts `make setup` fetched.

``SessionConfig(...).build()`` starts (or returns) the session: workers run this
interpreter, the state store is RocksDB (the exact window needs it), logs are quiet,
and ``kafka=True`` / ``delta=True`` load Spark's Kafka connector and Delta Lake from
the local jars folder through ``spark.jars``. Nothing is downloaded at run time: a
missing jar is a one-line error naming ``make setup``. On a real cluster, users pass
``--packages`` instead (docs/spark.md).

Quiet means from the first line: the JVM reads its log configuration when it starts,
so ``setLogLevel`` after ``getOrCreate`` comes too late for the start-up warnings.
``quiet=True`` writes :data:`QUIET_LOG4J2` to a file and passes it to the driver's
and executors' JVMs with ``-Dlog4j2.configurationFile``, quiets py4j's Python logger
and Python warnings in the workers, and mutes what Spark's Python runners print
through the JVM's stderr (:mod:`lowtide.spark.quiet`).

A session starts sooner from the class archive ``make setup`` writes
(:data:`CLASS_ARCHIVE`, :mod:`lowtide.apps.class_archive`): the driver's JVM maps the
classes a training run loaded instead of loading and verifying each from its jar.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shlex
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowtide.core.errors import LowtideError
from lowtide.spark.quiet import (
    filtered_jvm_stderr,
    mute_accumulator_hangups,
    mute_reported_errors,
)

__all__ = ["QUIET_LOG4J2", "JarsMissing", "SessionConfig", "class_archive_file",
           "class_archive_path", "driver_loads_fs", "fs_jar", "jars_dir", "prewarm",
           "quiet_log4j2_file", "read_archive_options", "session_jars",
           "write_archive_options"]

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Spark's default checkpoint manager goes through Hadoop's FileContext, whose local file
# system starts a `readlink` process for each file it renames into place: some 40
# processes per micro-batch of a windowed query (offsets, commits, state changelogs),
# measured with strace. Through the FileSystem API, renames are a rename(2) call.
FS_CHECKPOINTS = ("org.apache.spark.sql.execution.streaming.checkpointing."
                  "FileSystemBasedCheckpointFileManager")
# Hadoop's local file system starts a `chmod` process for every file and folder it
# creates (pyspark ships no native Hadoop library): about 10 a second over the demo's two
# queries. lowtide's (jars/fs, built by `make setup`) sets permissions in-process.
FS_NO_FORK = "dev.lowtide.hadoop.NoForkLocalFileSystem"
FS_JAR = "lowtide-fs.jar"
FS_IMPL = "spark.hadoop.fs.file.impl"
#: the driver JVM's class archive (Java's AppCDS), beside the jars ``make setup`` fetched
CLASS_ARCHIVE = "lowtide-classes.jsa"
#: the JVM says nothing about its archive: a stale one (other jars, another JDK) is
#: skipped, the session starts as it would without
_QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"
JARS_ENV = "LOWTIDE_JARS"
# Pinned in jars/spark/pom.xml; the names a user passes to --packages on a cluster.
KAFKA_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
DELTA_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"
_KAFKA_JARS = ("spark-sql-kafka-0-10_", "spark-token-provider-kafka-0-10_", "kafka-clients-",
               "commons-pool2-")
_DELTA_JARS = ("delta-spark_", "delta-storage-", "delta-kernel-", "unitycatalog-")


# Errors only, one line each. A query stopped between batches is not an error of the
# run, but Spark still logs the cancelled tasks of the trigger it interrupts (the
# writer's "Aborting commit" and the v2 write's "is aborting", a file sink's "Aborting
# job" when the stop lands as the next trigger starts writing, the Python runner's
# interrupted read): those loggers are off. Real failures still reach the caller as the
# query's exception, so a query's own "terminated with error" line (with a Java frame)
# is off too: lowtide's commands print that exception as one line. So are a failed
# task's lines (the executor's, with the Python traceback, and the scheduler's "aborting
# job"): a task retried then succeeds, and a job that fails raises in the query (a
# lowtide error raised in a task: as its one line, see spark/tracking/task_errors.py).
QUIET_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%throwable{short}
logger.writer.name = org.apache.spark.sql.execution.datasources.v2.DataWritingSparkTask
logger.writer.level = off
logger.files.name = org.apache.spark.sql.execution.datasources.FileFormatWriter
logger.files.level = off
logger.v2write.name = org.apache.spark.sql.execution.datasources.v2.WriteToDataSourceV2Exec
logger.v2write.level = off
logger.query.name = org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution
logger.query.level = off
logger.task.name = org.apache.spark.executor.Executor
logger.task.level = off
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = off
"""


def quiet_log4j2_file() -> Path:
    """:data:`QUIET_LOG4J2` in a file (one per user and content) for the JVMs to read;
    rewritten if what is there differs (a shared temporary directory)."""
    digest = hashlib.sha256(QUIET_LOG4J2.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"lowtide-{os.getuid()}-log4j2-{digest}.properties"
    if not path.is_file() or path.read_text() != QUIET_LOG4J2:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(QUIET_LOG4J2)
        tmp.replace(path)
    return path


class JarsMissing(LowtideError, RuntimeError):
    """The Kafka or Delta jars are not in the local jars folder."""


def jars_dir() -> Path:
    """``$LOWTIDE_JARS``, else ``jars/spark/lib`` of the checkout lowtide runs from
    (found from the working directory or from this file, for an editable install)."""
    if os.environ.get(JARS_ENV):
        return Path(os.environ[JARS_ENV])
    for start in (Path.cwd(), Path(__file__).resolve()):
        for folder in (start, *start.parents):
            candidate = folder / "jars" / "spark" / "lib"
            if candidate.is_dir():
                return candidate
    return Path.cwd() / "jars" / "spark" / "lib"


def session_jars(*, kafka: bool, delta: bool, folder: Path | None = None) -> list[str]:
    """The local jar files for the parts asked for; raises JarsMissing naming the fix."""
    folder = folder or jars_dir()
    wanted = [(kafka, _KAFKA_JARS, KAFKA_PACKAGE), (delta, _DELTA_JARS, DELTA_PACKAGE)]
    found: list[str] = []
    files = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    for on, prefixes, package in wanted:
        if not on:
            continue
        mine = [str(f) for f in files if f.name.startswith(prefixes)]
        if not any(Path(j).name.startswith(prefixes[0]) for j in mine):
            raise JarsMissing(
                f"{package} not found in {folder}: run `make setup` (or set {JARS_ENV}); "
                f"on a cluster pass --packages {package}")
        found += mine
    return found


def fs_jar(folder: Path | None = None) -> Path | None:
    """The jar of lowtide's local file system (:data:`FS_NO_FORK`), or None (one INFO
    line) where ``make setup`` did not build it: Hadoop's own then."""
    jar = (folder or jars_dir()) / FS_JAR
    if jar.is_file():
        return jar
    logging.getLogger(__name__).info(
        "%s not found: Hadoop's local file system starts a chmod process per file "
        "(run `make setup`)", jar)
    return None


def _add_fs_jar(out: dict[str, str], jar: Path, master: str | None) -> None:
    """``file:`` to lowtide's file system: the driver's JVM resolves ``fs.file.impl``
    from its class path (``spark.jars`` alone fails its start); executors in other JVMs
    (a cluster, ``local-cluster``) load the jar from ``spark.jars``, copied to each.
    Local mode's executors run in the driver's JVM: no copy (that is a `chmod a+x`
    process too). Beside any jars and class path a user's conf gives."""
    out[FS_IMPL] = FS_NO_FORK
    keys = [("spark.driver.extraClassPath", os.pathsep)]
    if not (master == "local" or (master or "").startswith("local[")):
        keys.append(("spark.jars", ","))
    for key, sep in keys:
        out[key] = sep.join(filter(None, (out.get(key), str(jar))))


def class_archive_path(folder: Path | None = None) -> Path:
    """Where ``make setup`` writes the driver JVM's class archive."""
    return (folder or jars_dir()) / CLASS_ARCHIVE


def class_archive_file(folder: Path | None = None) -> Path | None:
    """The class archive ``make setup`` wrote, or None."""
    path = class_archive_path(folder)
    return path if path.is_file() else None


def read_archive_options(archive: Path) -> str:
    """Driver JVM options that map the classes in ``archive``."""
    return f"{shlex.quote(f'-XX:SharedArchiveFile={archive}')} -Xshare:auto {_QUIET_CDS}"


def write_archive_options(archive: Path) -> str:
    """Driver JVM options that write the classes it loaded to ``archive`` as it exits."""
    return f"{shlex.quote(f'-XX:ArchiveClassesAtExit={archive}')} {_QUIET_CDS}"


def driver_loads_fs() -> bool:
    """Whether the driver's JVM will load :data:`FS_NO_FORK`: yes if the build starts
    it (the jar goes on its class path); a JVM already up (spark-submit's, a stopped
    session's) only if it has the class."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return not os.environ.get("PYSPARK_GATEWAY_PORT")  # set by spark-submit
    return bool(gateway.jvm.org.apache.spark.util.Utils.classIsLoadable(FS_NO_FORK))


@dataclass(frozen=True)
class SessionConfig:
    """How lowtide's commands and tests start Spark; ``conf`` overrides any default."""

    #: None: the master spark-submit was given
    master: str | None = "local[2]"
    app_name: str = "lowtide"
    shuffle_partitions: int = 2
    driver_memory: str | None = None
    kafka: bool = False
    delta: bool = False
    log_level: str = "ERROR"
    quiet: bool = True
    ui: bool = True
    #: Python workers to start in the background once the session is up (:func:`prewarm`)
    prewarm_workers: int = 0
    #: Python workers forked from :mod:`lowtide.spark.worker_daemon`, which imported
    #: pyarrow, pandas and lowtide's task modules once (each worker would import them).
    #: None: on a local master only, whose workers run this interpreter; elsewhere the
    #: executors' Python must import lowtide before a task adds ``--py-files``, so a
    #: cluster with lowtide installed on every node says True
    warm_daemon: bool | None = None
    #: the driver's JVM starts from :data:`CLASS_ARCHIVE` where ``make setup`` wrote it
    #: (about 2 s sooner on 2 cores; BENCHMARKS.md, "Start-up")
    class_archive: bool = True
    #: more options for the driver's JVM, after lowtide's
    driver_java_options: str = ""
    #: how long a Python worker may take to authenticate once it connected back
    #: (``spark.python.authenticate.socketTimeout``, Spark's default 15 s): long enough
    #: for a loaded machine; Spark 4.2's 10 s for a worker to connect back is fixed
    worker_timeout_s: int = 120
    conf: tuple[tuple[str, str], ...] = ()

    def settings(self, *, fs: bool = True) -> dict[str, str]:
        """Every Spark setting this config makes, for the builder or spark-submit;
        ``fs``: lowtide's local file system where its jar was built."""
        # deep Python plans (many tracked stages) overflow the default JVM stack
        java = "-Xss32m"
        out = {
            "spark.ui.enabled": str(self.ui).lower(),
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": str(self.shuffle_partitions),
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
            # changelog checkpoints: a batch commits its state changes, not RocksDB files
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
            "spark.python.worker.reuse": "true",
            "spark.python.authenticate.socketTimeout": f"{self.worker_timeout_s}s",
        }
        local = (self.master or "").startswith("local")
        if self.warm_daemon or (self.warm_daemon is None and local):
            out["spark.python.daemon.module"] = "lowtide.spark.worker_daemon"
        if self.quiet:
            java += f" -Dlog4j2.configurationFile=file:{quiet_log4j2_file()}"
            out["spark.executor.extraJavaOptions"] = java
            out["spark.executorEnv.PYTHONWARNINGS"] = "ignore"
        archive = class_archive_file() if self.class_archive else None
        driver = [java, read_archive_options(archive) if archive else "",
                  self.driver_java_options]
        out["spark.driver.extraJavaOptions"] = " ".join(filter(None, driver))
        if self.driver_memory:
            out["spark.driver.memory"] = self.driver_memory
        if local:  # checkpoints on the local disk
            out["spark.sql.streaming.checkpointFileManagerClass"] = FS_CHECKPOINTS
        jars = session_jars(kafka=self.kafka, delta=self.delta)
        if jars:
            out["spark.jars"] = ",".join(jars)
        if self.delta:
            out["spark.sql.extensions"] = "io.delta.sql.DeltaSparkSessionExtension"
            out["spark.sql.catalog.spark_catalog"] = (
                "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        out.update(dict(self.conf))
        no_fork_jar = fs_jar() if fs and FS_IMPL not in out else None  # a user's wins
        if no_fork_jar:
            _add_fs_jar(out, no_fork_jar, self.master)
        return out

    def build(self) -> Any:
        """Start the session (or return the running one) with these settings."""
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        if self.quiet:
            logging.getLogger("py4j").setLevel(logging.ERROR)
            mute_accumulator_hangups()
            mute_reported_errors()
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.appName(self.app_name)
        if self.master is not None:
            builder = builder.master(self.master)
        for key, value in self.settings(fs=driver_loads_fs()).items():
            builder = builder.config(key, value)
        with filtered_jvm_stderr() if self.quiet else contextlib.nullcontext():
            spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel(self.log_level)
        if self.prewarm_workers:
            prewarm(spark, self.prewarm_workers)
        return spark


def _import_modules(batches: Any) -> Any:
    """A worker's share of :func:`prewarm`: import what lowtide's tasks import."""
    import lowtide.spark.operators.state_processor
    import lowtide.spark.sinks
    import lowtide.spark.sources  # noqa: F401

    yield from batches


def prewarm(spark: Any, workers: int = 2) -> threading.Thread:
    """Start ``workers`` Python workers and import lowtide's task modules in them, in
    a background thread, while the caller plans its query: Spark keeps idle workers
    (``spark.python.worker.reuse``) and hands them to the query's first tasks, which
    then skip the start-up. Join the thread to wait for it."""

    def run() -> None:
        try:
            df = spark.range(0, workers, 1, workers)
            df.mapInArrow(_import_modules, df.schema).count()
        except Exception:  # pre-warming is an optimisation: the query starts anyway
            logging.getLogger(__name__).debug("prewarm failed", exc_info=True)

    thread = threading.Thread(target=run, name="lowtide-prewarm", daemon=True)
    thread.start()
    return thread
