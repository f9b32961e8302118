"""A SparkSession with lowtide's defaults, and the JVM parts `make setup` fetched.

``SessionConfig(...).build()`` starts (or returns) the session: workers run this
interpreter, the state store is RocksDB (the exact window needs it), logs are quiet,
and ``kafka=True`` / ``delta=True`` load Spark's Kafka connector and Delta Lake from
the local jars folder through ``spark.jars``. Nothing is downloaded at run time: a
missing jar is a one-line error naming ``make setup``. On a real cluster, users pass
``--packages`` instead (docs/spark.md).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["JarsMissing", "SessionConfig", "jars_dir", "session_jars"]

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
JARS_ENV = "LOWTIDE_JARS"
# Pinned in jars/spark/pom.xml; the names a user passes to --packages on a cluster.
KAFKA_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
DELTA_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"
_KAFKA_JARS = ("spark-sql-kafka-0-10_", "spark-token-provider-kafka-0-10_", "kafka-clients-",
               "commons-pool2-")
_DELTA_JARS = ("delta-spark_", "delta-storage-", "delta-kernel-", "unitycatalog-")


class JarsMissing(RuntimeError):
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


@dataclass(frozen=True)
class SessionConfig:
    """How lowtide's commands and tests start Spark; ``conf`` overrides any default."""

    master: str = "local[2]"
    app_name: str = "lowtide"
    shuffle_partitions: int = 2
    driver_memory: str | None = None
    kafka: bool = False
    delta: bool = False
    log_level: str = "ERROR"
    conf: tuple[tuple[str, str], ...] = ()

    def settings(self) -> dict[str, str]:
        """Every Spark setting this config makes, for the builder or spark-submit."""
        out = {
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": str(self.shuffle_partitions),
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
            # deep Python plans (many tracked stages) overflow the default JVM stack
            "spark.driver.extraJavaOptions": "-Xss32m",
        }
        if self.driver_memory:
            out["spark.driver.memory"] = self.driver_memory
        jars = session_jars(kafka=self.kafka, delta=self.delta)
        if jars:
            out["spark.jars"] = ",".join(jars)
        if self.delta:
            out["spark.sql.extensions"] = "io.delta.sql.DeltaSparkSessionExtension"
            out["spark.sql.catalog.spark_catalog"] = (
                "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        out.update(dict(self.conf))
        return out

    def build(self) -> Any:
        """Start the session (or return the running one) with these settings."""
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master(self.master).appName(self.app_name)
        for key, value in self.settings().items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel(self.log_level)
        return spark
