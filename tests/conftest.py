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


#: a Spark test still running after this long leaves thread dumps (see _stall_dumps)
STALL_DUMP_S = float(os.environ.get("LOWTIDE_STALL_DUMP_S", "100"))
_jvm_pid: list[int] = []  # the session's driver JVM, once it started


@pytest.fixture(autouse=True)
def _stall_dumps(request: pytest.FixtureRequest) -> Iterator[None]:
    """A Spark test that runs past STALL_DUMP_S (a query stalled: rare, on a loaded
    machine) writes the driver JVM's threads (`jstack`) and this process's Python
    stacks to a file and names it on stderr, shown with the test's failure: evidence
    from the run that stalled, not from a rerun that passes."""
    if "spark" not in request.fixturenames:
        yield
        return
    import faulthandler
    import subprocess
    import tempfile
    import threading

    def dump() -> None:
        fd, path = tempfile.mkstemp(prefix="lowtide-stall-", suffix=".txt")
        with os.fdopen(fd, "w") as out:
            out.write(f"{request.node.nodeid}: running for {STALL_DUMP_S:g} s\n")
            if _jvm_pid:
                out.flush()
                subprocess.run(["jstack", str(_jvm_pid[0])], stdout=out, stderr=out,
                               timeout=60, check=False)
            out.flush()
            faulthandler.dump_traceback(out, all_threads=True)
        print(f"stalled {STALL_DUMP_S:g} s: thread dumps in {path}", file=sys.stderr)

    timer = threading.Timer(STALL_DUMP_S, dump)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


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
    _jvm_pid.append(int(session.sparkContext._jvm.ProcessHandle.current().pid()))
    try:
        yield session
    finally:
        session.stop()
