"""Where rows enter a tracked pipeline: :class:`Front` producers and the ingest log
they write, the log's Spark source, and the generator source (a front per partition,
for demos and benchmarks). Names load on first use: a producer that imports
:class:`Front` does not import pyspark."""

from lowtide import lazy_exports

__all__ = [
    "GEN_SCHEMA",
    "UNTRACKED_SCHEMA",
    "Front",
    "GenSource",
    "GenStreamReader",
    "GeneratorSpec",
    "IngestReader",
    "IngestWriter",
    "LogSource",
    "gen_rows",
    "label_ms",
    "rows_before",
]

__getattr__ = lazy_exports(__name__, {
    "Front": "lowtide.spark.sources.front",
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
})
