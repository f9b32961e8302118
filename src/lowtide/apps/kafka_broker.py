"""A single-node Apache Kafka broker (KRaft mode, no ZooKeeper) on 127.0.0.1, for tests,
the demo and ``lowtide kafka up|down|status|topic``.

``KafkaBrokerConfig(data_dir).build()`` picks free ports, writes ``server.properties``
under ``data_dir``, formats the storage (``kafka.tools.StorageTool format``, Kafka
4.1's storage tool), starts ``java -cp "jars/kafka/lib/*" kafka.Kafka`` in a process
group of its own and returns once the broker accepts connections; ``stop()`` ends that
process group by its id (TERM, then KILL). A broker that does not come up is stopped
before the error is raised. The jars come from ``make setup`` (jars/kafka/pom.xml);
nothing is downloaded at run time.

The broker's data stays in ``data_dir`` across ``stop()`` and a later ``build()``: the
storage is formatted once, and later starts reuse its cluster id (``reset=True``
deletes the data first). ``lowtide kafka up`` keeps it under the user's state
directory (``$XDG_STATE_HOME/lowtide/kafka``, else ``~/.local/state/lowtide/kafka``;
``$LOWTIDE_KAFKA_DIR`` or ``--dir`` elsewhere), never in the working directory.

A user with a real cluster skips all of this: their brokers' address is the
``bootstrap.servers`` of lowtide's producer helpers and of Spark's Kafka source.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from lowtide import LowtideError

__all__ = ["BrokerFailed", "KafkaBroker", "KafkaBrokerConfig", "default_dir", "kafka_jars_dir",
           "register"]

JARS_ENV = "LOWTIDE_KAFKA_JARS"
DIR_ENV = "LOWTIDE_KAFKA_DIR"
STATE_FILE = "broker.json"


def default_dir() -> Path:
    """Where ``lowtide kafka`` keeps the broker: ``$LOWTIDE_KAFKA_DIR``, else
    ``$XDG_STATE_HOME/lowtide/kafka``, else ``~/.local/state/lowtide/kafka``."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "lowtide" / "kafka"


class BrokerFailed(LowtideError, RuntimeError):
    """The broker could not be started (the message names the log to read)."""


def kafka_jars_dir() -> Path:
    """``$LOWTIDE_KAFKA_JARS``, else ``jars/kafka/lib`` of the checkout (found from the
    working directory upwards)."""
    if os.environ.get(JARS_ENV):
        return Path(os.environ[JARS_ENV])
    here = Path.cwd()
    for folder in (here, *here.parents, *Path(__file__).resolve().parents):
        if (folder / "jars" / "kafka" / "lib").is_dir():
            return folder / "jars" / "kafka" / "lib"
    return here / "jars" / "kafka" / "lib"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def server_properties(data_dir: Path, port: int, controller_port: int) -> str:
    """One process as broker and controller; topics of one replica (one node)."""
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={data_dir / 'logs'}",
        "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        # consumers of a fresh group start at once instead of after 3 s
        "group.initial.rebalance.delay.ms=0",
        "",
    ])


@dataclass(frozen=True)
class KafkaBrokerConfig:
    """Where the broker keeps its data and how long it may take to come up."""

    data_dir: Path
    jars: Path | None = None
    heap_mb: int = 384
    start_timeout_s: float = 60.0
    reset: bool = False  # delete the broker's data (topics, offsets) first

    def build(self) -> KafkaBroker:
        """Format the storage (once: a later start keeps the data and its cluster id)
        and start the broker; returns once it accepts connections."""
        jars = self.jars or kafka_jars_dir()
        if not any(jars.glob("kafka_2.13-*.jar")):
            raise BrokerFailed(f"no Kafka broker jars in {jars}: run `make setup` "
                               f"(or set {JARS_ENV})")
        data_dir = Path(self.data_dir).resolve()
        if self.reset:
            shutil.rmtree(data_dir / "logs", ignore_errors=True)
        data_dir.mkdir(parents=True, exist_ok=True)
        port, controller_port = free_port(), free_port()
        props = data_dir / "server.properties"
        props.write_text(server_properties(data_dir, port, controller_port))
        java = ["java", f"-Xmx{self.heap_mb}m", "-cp", f"{jars}/*"]
        log_path = data_dir / "broker.log"
        cluster = cluster_id(data_dir / "logs")
        with open(log_path, "ab") as log:
            fmt = subprocess.run([*java, "kafka.tools.StorageTool", "format", "-t", cluster,
                                  "-c", str(props), "--ignore-formatted"],
                                 stdout=log, stderr=subprocess.STDOUT, check=False,
                                 timeout=self.start_timeout_s)
            if fmt.returncode != 0:
                raise BrokerFailed(f"formatting the broker's storage failed: see {log_path}")
            proc = subprocess.Popen([*java, "kafka.Kafka", str(props)], stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        broker = KafkaBroker(proc.pid, f"127.0.0.1:{port}", data_dir)
        try:
            broker.wait_ready(self.start_timeout_s, lambda: proc.poll() is None)
        except BaseException:
            broker.stop()
            raise
        return broker


def cluster_id(logs: Path) -> str:
    """The cluster id the storage in ``logs`` was formatted with (Kafka refuses to start
    on storage of another cluster), or a new one."""
    meta = logs / "meta.properties"
    if meta.exists():
        for line in meta.read_text().splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
    while True:  # as Kafka's Uuid.randomUuid: an id starting with "-" reads as an option
        new = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not new.startswith("-"):
            return new


@dataclass(frozen=True)
class KafkaBroker:
    """A running broker: its process (group) id, address and data directory."""

    pid: int
    bootstrap: str
    data_dir: Path

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    def wait_ready(self, timeout_s: float, alive: object = None) -> None:
        """Wait until the broker accepts connections and answers a metadata request."""
        host, port = self.bootstrap.rsplit(":", 1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if callable(alive) and not alive():
                raise BrokerFailed(f"the Kafka broker exited while starting: see {self.log_path}")
            if accepts(host, int(port)) and self._answers():
                return
            time.sleep(0.2)
        raise BrokerFailed(f"the Kafka broker did not start within {timeout_s:.0f} s: "
                           f"see {self.log_path}")

    def _answers(self) -> bool:
        """A metadata round trip, when confluent-kafka is installed (a listening socket
        comes up before the broker has joined its own quorum)."""
        try:
            from confluent_kafka.admin import AdminClient
        except ImportError:
            return True
        try:
            meta = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
        except Exception:  # KafkaException while the broker is starting: try again
            return False
        return bool(meta.brokers)

    def running(self) -> bool:
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            return False
        return b"kafka.Kafka" in cmdline  # not a later process that reused the pid

    def stop(self, timeout_s: float = 20.0) -> None:
        """End the broker's process group (TERM, then KILL after ``timeout_s``)."""
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            if not self.running():
                break
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while self.running() and time.monotonic() < deadline:
                self._reap()
                time.sleep(0.1)
        self._reap()

    def _reap(self) -> None:
        """Collect the exit status if the broker is our child (no zombie is left)."""
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, os.WNOHANG)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"pid": self.pid, "bootstrap": self.bootstrap,
                                    "data_dir": str(self.data_dir)}) + "\n")

    @classmethod
    def load(cls, path: Path) -> KafkaBroker:
        doc = json.loads(path.read_text())
        return cls(int(doc["pid"]), str(doc["bootstrap"]), Path(doc["data_dir"]))


def _state(args: argparse.Namespace) -> Path:
    return Path(args.dir or default_dir()) / STATE_FILE


def _recorded(args: argparse.Namespace) -> KafkaBroker | None:
    state = _state(args)
    return KafkaBroker.load(state) if state.exists() else None


def _up(args: argparse.Namespace) -> int:
    broker = _recorded(args)
    if broker is not None and broker.running():
        print(f"already running: {broker.bootstrap} (lowtide kafka down --dir "
              f"{_state(args).parent})")
        return 1
    state = _state(args)
    broker = KafkaBrokerConfig(state.parent, reset=args.reset).build()
    broker.save(state)
    print(json.dumps({"bootstrap": broker.bootstrap, "pid": broker.pid, "state": str(state)}))
    return 0


def _down(args: argparse.Namespace) -> int:
    broker = _recorded(args)
    if broker is None:
        print(f"no broker recorded in {_state(args)}")
        return 1
    broker.stop()
    _state(args).unlink()
    print("stopped (its data stays: `lowtide kafka up` starts it again, --reset empties it)")
    return 0


def _status(args: argparse.Namespace) -> int:
    broker = _recorded(args)
    running = broker is not None and broker.running()
    print(json.dumps({"running": running,
                      "bootstrap": broker.bootstrap if broker else None,
                      "pid": broker.pid if broker else None}))
    return 0 if running else 1


def _topic(args: argparse.Namespace) -> int:
    """Create topic ``args.name`` with ``args.partitions`` partitions (one replica)."""
    broker = _recorded(args)
    bootstrap = args.bootstrap or (broker.bootstrap if broker and broker.running() else None)
    if bootstrap is None:
        raise BrokerFailed(f"no broker runs in {_state(args).parent}: `lowtide kafka up` "
                           "first, or give --bootstrap HOST:PORT")
    try:
        from confluent_kafka.admin import AdminClient, NewTopic
    except ImportError:
        raise BrokerFailed("creating a topic needs confluent-kafka: "
                           "pip install 'lowtide[kafka]'") from None
    admin = AdminClient({"bootstrap.servers": bootstrap})
    have = admin.list_topics(timeout=10).topics.get(args.name)
    if have is not None:
        n = len(have.partitions)
        print(f"topic {args.name!r} exists with {n} partition(s)")
        return 0 if n == args.partitions else 1
    future = admin.create_topics([NewTopic(args.name, args.partitions, 1)])[args.name]
    try:
        future.result(timeout=30)
    except Exception as err:  # KafkaException: the broker's reason, in one line
        raise BrokerFailed(f"creating topic {args.name!r} failed: {err}") from None
    print(json.dumps({"topic": args.name, "partitions": args.partitions,
                      "bootstrap": bootstrap}))
    return 0


def register(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``lowtide kafka up|down|status|topic [--dir DIR]``."""
    kafka = sub.add_parser("kafka", help="a local single-node Kafka broker (KRaft) for "
                           "trying lowtide on Kafka")
    kafka.set_defaults(handler=_status, dir=None)  # bare `lowtide kafka`: status
    actions = kafka.add_subparsers(dest="kafka", metavar="ACTION")
    for name, handler, text in (
            ("up", _up, "start it (its data kept from the last run); prints its bootstrap "
                        "address"),
            ("down", _down, "stop it by its recorded pid; its data stays"),
            ("status", _status, "running or not, and where; exits 1 when no broker runs"),
            ("topic", _topic, "create topic NAME (--partitions N) on it")):
        p = actions.add_parser(name, help=text, description=text)
        p.add_argument("--dir", default=None,
                       help=f"data dir and state file {STATE_FILE} (default "
                            f"${DIR_ENV}, else $XDG_STATE_HOME/lowtide/kafka, else "
                            "~/.local/state/lowtide/kafka)")
        p.set_defaults(handler=handler)
        if name == "up":
            p.add_argument("--reset", action="store_true",
                           help="delete the broker's data (topics, offsets) first")
        if name == "topic":
            p.add_argument("name", help="the topic")
            p.add_argument("--partitions", type=int, default=1, help="(default 1)")
            p.add_argument("--bootstrap", default=None,
                           help="another broker's HOST:PORT (default: the one `up` started)")
