"""One real Kafka broker (KRaft, 127.0.0.1) for the whole test session, started on
first use and stopped by its process group id; tests that need it skip where java or
the broker jars (``make setup``) are missing. ``kafka_topic`` makes a fresh topic."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable, Iterator

import pytest

from lowtide.apps.kafka_broker import KafkaBroker, KafkaBrokerConfig, kafka_jars_dir

_topics = itertools.count()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    if shutil.which("java") is None or not any(kafka_jars_dir().glob("kafka_2.13-*.jar")):
        pytest.skip("needs java and the Kafka broker jars (make setup)")
    pytest.importorskip("confluent_kafka")
    broker = KafkaBrokerConfig(tmp_path_factory.mktemp("kafka"), start_timeout_s=90).build()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def kafka_topic(kafka_broker: KafkaBroker) -> Callable[[int], str]:
    """``kafka_topic(partitions)`` -> the name of a new topic on the session's broker."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})

    def make(partitions: int = 1) -> str:
        name = f"lt-test-{next(_topics)}"
        for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result(timeout=30)
        return name

    return make
