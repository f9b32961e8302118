"""Suite-wide settings and fixtures.

Tests assert behaviour, never speed: Hypothesis's per-example deadline is off (a loaded
CI machine made a 50 ms example take 260 ms). Tests that need Spark share ONE
SparkSession for the whole run (local[2], small shuffles, no UI)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

from lowtide.spark.session import FS_CHECKPOINTS
from tests.kafka_broker import kafka_broker, kafka_topic  # noqa: F401 (fixtures)

settings.register_profile("lowtide", deadline=None)
settings.load_profile("lowtide")

PY = sys.executable


def pytest_collection_modifyitems(items: list[Any]) -> None:
    """Test modules are not importable on Spark's Python workers: ship the functions
    they define (and the helpers they use) by value."""
    try:
        from pyspark import cloudpickle
    except ImportError:
        return
    for name, mod in list(sys.modules.items()):
        if name == "tests" or not name.startswith("tests."):
            continue
        if getattr(mod, "__file__", None) and not name.endswith(".conftest"):
            cloudpickle.register_pickle_by_value(mod)


def _lowtide_jar_settings() -> dict[str, str]:
    """As lowtide's sessions: the Kafka connector and Delta Lake from the jars `make
    setup` fetched (without them the Delta and Kafka tests skip, naming the fix), and
    its local file system without chmod processes where `make setup` built it."""
    from lowtide.spark.session import FS_IMPL, JarsMissing, SessionConfig, driver_loads_fs

    fs = driver_loads_fs()
    try:
        conf = SessionConfig(kafka=True, delta=True).settings(fs=fs)
    except JarsMissing:
        conf = SessionConfig().settings(fs=fs)
    keys = ("spark.jars", "spark.sql.extensions", "spark.sql.catalog.spark_catalog",
            FS_IMPL, "spark.driver.extraClassPath")
    return {key: conf[key] for key in keys if key in conf}


def _driver_java_options() -> str:
    """As lowtide's sessions (a deep stack, the class archive `make setup` wrote), with
    Spark's own log configuration: the suite sets its level itself."""
    from lowtide.spark.session import SessionConfig

    return str(SessionConfig(quiet=False).settings(fs=False)["spark.driver.extraJavaOptions"])


@pytest.fixture(autouse=True)
def _no_agent_dials_a_dead_tracker() -> Iterator[None]:
    """After each test, close this process's agents whose tracker is gone (a test's
    server killed by pid, an agent a test did not close). Left running they redial its
    port every second, and a Spark worker's callback socket that took the port read
    their frame as a length (1 GiB: out of heap, a CI run). Trackers this process
    stops close their shared agents themselves."""
    yield
    from lowtide.service.client.base_agent import BaseAgent

    for agent in list(BaseAgent.live):
        main = getattr(agent._state, "main", None)
        if main is not None and agent._running() and not main.connected.is_set():
            agent.close(timeout_s=0.5)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = PY
    os.environ["PYSPARK_DRIVER_PYTHON"] = PY
    pyspark_sql = pytest.importorskip("pyspark.sql")
    builder = (
        pyspark_sql.SparkSession.builder.master("local[2,4]")
        .appName("lowtide-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.extraJavaOptions", _driver_java_options())
        # as lowtide's own sessions (SessionConfig.worker_timeout_s): a loaded machine
        .config("spark.python.authenticate.socketTimeout", "120s")
        # as lowtide's local sessions: renames without a `readlink` process each
        .config("spark.sql.streaming.checkpointFileManagerClass", FS_CHECKPOINTS)
        # as lowtide's sessions: workers forked with the task modules imported
        .config("spark.python.daemon.module", "lowtide.spark.worker_daemon")
    )
    for key, value in _lowtide_jar_settings().items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
