"""The local Kafka broker: the session fixture serves producers and consumers; the CLI
starts one, records it and stops it by its pid; a broker that cannot start leaves no
process behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lowtide.apps.kafka_broker import BrokerFailed, KafkaBroker, KafkaBrokerConfig, default_dir
from lowtide.cli import main


def test_the_broker_delivers_to_a_consumer(kafka_broker: KafkaBroker, kafka_topic) -> None:
    from confluent_kafka import Consumer, Producer

    topic = kafka_topic(2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for i in range(6):
        producer.produce(topic, b"%d" % i, partition=i % 2)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": "t",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: set[bytes] = set()
    for _ in range(60):
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.add(msg.value())
        if len(got) == 6:
            break
    consumer.close()
    assert got == {b"%d" % i for i in range(6)}
    assert kafka_broker.running()


def test_a_broker_that_cannot_start_is_an_error_and_leaves_no_process(tmp_path: Path) -> None:
    with pytest.raises(BrokerFailed, match="make setup"):
        KafkaBrokerConfig(tmp_path, jars=tmp_path / "nowhere").build()
    with pytest.raises(BrokerFailed, match=r"broker\.log"):
        KafkaBrokerConfig(tmp_path, heap_mb=1).build()  # the JVM refuses a 1 MB heap


@pytest.mark.socket
def test_cli_up_status_down_by_pid(kafka_broker: KafkaBroker, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    state_dir = str(tmp_path / "k")
    assert main(["kafka", "up", "--dir", state_dir]) == 0
    up = json.loads(capsys.readouterr().out)
    broker = KafkaBroker.load(Path(up["state"]))
    try:
        assert broker.running() and broker.bootstrap == up["bootstrap"]
        assert main(["kafka", "status", "--dir", state_dir]) == 0
        assert json.loads(capsys.readouterr().out)["running"] is True
        assert main(["kafka", "down", "--dir", state_dir]) == 0
        assert not broker.running()
        assert main(["kafka", "status", "--dir", state_dir]) == 1
    finally:
        broker.stop()


@pytest.mark.slow  # ~20 s; the CLI by default: test_cli_up_status_down_by_pid
@pytest.mark.socket
def test_cli_up_down_up_keeps_the_topics_and_reset_empties_them(
        kafka_broker: KafkaBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the second `up` in the same dir formatted the storage with a new cluster
    id and Kafka refused it (a Java and a Python traceback)."""
    d = ["--dir", str(tmp_path / "k")]
    started: list[KafkaBroker] = []

    def up(*extra: str) -> None:
        assert main(["kafka", "up", *d, *extra]) == 0
        last = capsys.readouterr().out.splitlines()[-1]  # after a `down`'s line
        started.append(KafkaBroker.load(Path(json.loads(last)["state"])))

    try:
        up()
        assert main(["kafka", "topic", "events", "--partitions", "3", *d]) == 0
        assert json.loads(capsys.readouterr().out)["partitions"] == 3
        assert main(["kafka", "down", *d]) == 0
        up()
        assert main(["kafka", "topic", "events", "--partitions", "3", *d]) == 0
        assert capsys.readouterr().out == "topic 'events' exists with 3 partition(s)\n"
        assert main(["kafka", "down", *d]) == 0
        up("--reset")
        assert main(["kafka", "topic", "events", *d]) == 0
        assert json.loads(capsys.readouterr().out)["partitions"] == 1  # a new topic
        assert main(["kafka", "down", *d]) == 0
        capsys.readouterr()
        assert main(["kafka", "topic", "events", *d]) == 1  # no broker: one line
        err = capsys.readouterr().err
        assert err.startswith("lowtide kafka: no broker runs in ") and err.count("\n") == 1
    finally:
        for broker in started:
            broker.stop()


def test_the_default_dir_is_the_users_not_the_working_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LOWTIDE_KAFKA_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_dir() == tmp_path / "lowtide" / "kafka"
    monkeypatch.setenv("LOWTIDE_KAFKA_DIR", "/srv/k")
    assert default_dir() == Path("/srv/k")
