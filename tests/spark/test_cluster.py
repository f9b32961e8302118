"""A real cluster (issue 23 point 3): a Spark standalone master and two workers on
127.0.0.1 started from the installed pyspark's jars, a standalone ``lowtide serve``
with a secret, and the demo's windowed pipeline submitted with ``spark-submit``
(lowtide reaches the executors as a ``--py-files`` zip of src/lowtide). Its exact
windows equal a batch recomputation. Every process is stopped by its pid, also when
the test fails. docs/cluster.md is the same recipe by hand."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import lowtide
from tests.spark.helpers import free_port

pytestmark = pytest.mark.spark

SRC = Path(lowtide.__file__).parent  # the package the zip is made of
JOB = SRC / "apps" / "cluster_job.py"


def wait_for(what: str, ready: Callable[[], bool], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready within {timeout_s:.0f} s")
        time.sleep(0.5)


def alive_workers(webui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=5) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except OSError:
        return 0


class Processes:
    """Processes started by the test, each logging to a file; ``stop`` ends them by pid."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> Path:
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            self.started.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                 env=env, start_new_session=True))
        return log

    def stop(self) -> None:
        for proc in reversed(self.started):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in reversed(self.started):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture()
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop()




@pytest.mark.slow  # ~1.5-3.5 min: a master, a worker and their JVMs
def test_exact_windows_on_a_standalone_cluster(tmp_path: Path, processes: Processes) -> None:
    pyspark_home = Path(__import__("pyspark").__file__).parent
    # cluster processes and the job see lowtide only through the zip, never PYTHONPATH
    bare = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LOWTIDE_SECRET")}
    # a worker builds its executors' command from SPARK_HOME; outside a Spark
    # distribution it asks for the Scala version, or fails every executor with
    # "Cannot find any build directories"
    bare |= {"SPARK_HOME": str(pyspark_home), "SPARK_SCALA_VERSION": "2.13"}
    secret = tmp_path / "secret"
    secret.write_text(secrets.token_hex(16))
    secret.chmod(0o600)

    tracker_port = free_port()
    serve_env = {**bare, "PYTHONPATH": str(SRC.parent)}
    serve_log = processes.start("serve", [
        sys.executable, "-m", "lowtide.cli", "serve", "--port", str(tracker_port),
        "--secret-file", str(secret), "--log-format", "text"], serve_env)
    wait_for("lowtide serve", lambda: "lowtide serving" in serve_log.read_text())

    master_port, webui_port = free_port(), free_port()
    jars = f"{pyspark_home}/jars/*"
    java = shutil.which("java") or "java"
    processes.start("master", [java, "-cp", jars, "org.apache.spark.deploy.master.Master",
                               "--host", "127.0.0.1", "--port", str(master_port),
                               "--webui-port", str(webui_port)], bare)
    master = f"spark://127.0.0.1:{master_port}"
    for i in range(2):
        processes.start(f"worker{i}", [
            java, "-cp", jars, "org.apache.spark.deploy.worker.Worker", master,
            "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
            "--webui-port", str(free_port()), "--work-dir", str(tmp_path / f"work{i}")], bare)
    wait_for("two workers", lambda: alive_workers(webui_port) == 2)

    package = shutil.make_archive(str(tmp_path / "lowtide"), "zip", SRC.parent, "lowtide")
    submit = [str(pyspark_home / "bin" / "spark-submit"), "--master", master,
              "--py-files", package,
              "--conf", f"spark.pyspark.python={sys.executable}",
              "--conf", "spark.executor.memory=768m", "--conf", "spark.cores.max=2",
              str(JOB), "--tracker", f"tcp://127.0.0.1:{tracker_port}",
              "--dir", str(tmp_path / "run"), "--seconds", "4"]
    job_env = {**bare, "PYSPARK_PYTHON": sys.executable,
               "LOWTIDE_SECRET": secret.read_text()}
    done = subprocess.run(submit, capture_output=True, text=True, env=job_env, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["master"] == master and doc["executors"] == 2
    assert doc["lowtide_on_executors"]
    assert all("lowtide.zip" in path for path in doc["lowtide_on_executors"])
    assert doc["windows"] > 0 and doc["exact"] == doc["windows"]
    assert doc["missing"] == doc["differ"] == doc["duplicates"] == doc["unexpected"] == 0
    assert doc["matches_batch"] is True
    # the observed metrics in lastProgress, read on the driver where Spark computes them
    # (issue 34 point 8: they were null on a cluster; issue 31: no work in the tasks)
    figures = doc["observed"]
    assert figures is not None, "no progress with lowtide's figures"
    assert figures["sink_min_time"] > 0 and figures["global_min_time"] > 0
    assert figures["min_time.parse"] > 0 and figures["sink_lag_ms"] > 0
    assert figures["stuck_windows"] == 0 and json.loads(figures["late"]) == {}
