"""Where rows enter a tracked pipeline: :class:`Front` producers (the labels they put
on records: ``labels``; Kafka and file writers for them), the ingest log they write,
the log's Spark source, and the generator source (a front per partition, for demos
and benchmarks). Names load on first use: a producer that imports
:class:`Front` does not import pyspark."""

from lowtide import lazy_exports

__all__ = [
    "ACK_COLUMN",
    "GEN_SCHEMA",
    "KAFKA_CLIENT_LOGGER",
    "KAFKA_HEADER_EXPRS",
    "TIME_COLUMN",
    "UNTRACKED_SCHEMA",
    "BadEventTime",
    "DeliveryFailed",
    "FilesProducerConfig",
    "Front",
    "GenSource",
    "GenStreamReader",
    "GeneratorSpec",
    "IngestReader",
    "IngestWriter",
    "KafkaProducerConfig",
    "Labelled",
    "LateRecords",
    "LogSource",
    "TimesOutOfRange",
    "from_label",
    "gen_rows",
    "label_ms",
    "log_status",
    "rows_before",
]

__getattr__ = lazy_exports(__name__, {
    "Front": "lowtide.spark.sources.front",
    "Labelled": "lowtide.spark.sources.front",
    "LateRecords": "lowtide.spark.sources.lateness",
    "BadEventTime": "lowtide.spark.sources.event_time",
    "TimesOutOfRange": "lowtide.spark.sources.lateness",
    "from_label": "lowtide.spark.sources.labels",
    "ACK_COLUMN": "lowtide.spark.sources.labels",
    "TIME_COLUMN": "lowtide.spark.sources.labels",
    "KAFKA_HEADER_EXPRS": "lowtide.spark.sources.labels",
    "KafkaProducerConfig": "lowtide.spark.sources.kafka_producer",
    "DeliveryFailed": "lowtide.spark.sources.kafka_producer",
    "KAFKA_CLIENT_LOGGER": "lowtide.spark.sources.kafka_producer",
    "FilesProducerConfig": "lowtide.spark.sources.files_producer",
    "GEN_SCHEMA": "lowtide.spark.sources.generator",
    "UNTRACKED_SCHEMA": "lowtide.spark.sources.generator",
    "GeneratorSpec": "lowtide.spark.sources.generator",
    "GenSource": "lowtide.spark.sources.generator",
    "GenStreamReader": "lowtide.spark.sources.generator",
    "gen_rows": "lowtide.spark.sources.generator",
    "label_ms": "lowtide.spark.sources.generator",
    "rows_before": "lowtide.spark.sources.generator",
    "IngestReader": "lowtide.spark.sources.ingest",
    "IngestWriter": "lowtide.spark.sources.ingest",
    "LogSource": "lowtide.spark.sources.log_source",
    "log_status": "lowtide.spark.sources.retention",
})
