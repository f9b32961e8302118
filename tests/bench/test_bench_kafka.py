"""``lowtide bench spark --source kafka`` on the suite's broker and session: both
queries drain the same topic, the tracked one completes through the producers' last
promise, and the result carries the ratios under their names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lowtide.bench.spark import kafka as bench_kafka
from tests.spark.sources.helpers import needs_kafka_connector

pytestmark = pytest.mark.spark


@pytest.mark.slow  # ~30 s; Kafka sources by default: tests/spark/sources/test_read_stream_kafka.py
def test_tracked_and_untracked_drain_one_topic(spark, kafka_broker, tmp_path: Path) -> None:
    needs_kafka_connector(spark)
    cfg = bench_kafka.KafkaBenchConfig(fronts=2, records=6_000, rows_per_batch=1_000,
                                       warmup_batches=1, rounds=2)
    rounds = [bench_kafka.one_round(spark, kafka_broker.bootstrap, tmp_path, r, cfg)
              for r in range(cfg.rounds)]
    for r in rounds:  # both read every record of the round's topic
        assert r["untracked"][0] > 0 and r["tracked"][0] > 0
    result = bench_kafka.summary(rounds)
    assert json.loads(json.dumps(result)) == result
    assert (result["bench"], result["source"]) == ("spark", "kafka")
    assert result["throughput_ratio"] > 0 and result["cpu_ratio"] > 0
