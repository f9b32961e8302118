"""lowtide on PySpark: describe a tracked pipeline like a PySpark query, run it, and
read exact completeness. The guide is docs/spark.md.

What a pipeline is made of lives in the subpackages: ``sources`` (fronts, the ingest
log, the generator), ``operators`` (tracked steps, exact windows), ``sinks``,
``pipeline`` (the description, queries and progress) and ``tracking`` (the tracking
column and the connection every task shares). Names load on first use: importing
``lowtide.spark.sources.front`` (a producer) does not import pyspark.
"""

from lowtide import lazy_exports

__all__ = [
    "Completeness",
    "Front",
    "GeneratorSpec",
    "Pipeline",
    "PipelineStatus",
    "SessionConfig",
    "Stream",
    "TrackedQuery",
    "class_archive_path",
    "complete_below",
    "read_complete",
    "stop_between_batches",
    "write_archive_options",
]

__getattr__ = lazy_exports(__name__, {
    "Completeness": "lowtide.spark.sinks.completeness",
    "Front": "lowtide.spark.sources.front",
    "GeneratorSpec": "lowtide.spark.sources.generator",
    "Pipeline": "lowtide.spark.pipeline.builder",
    "PipelineStatus": "lowtide.spark.pipeline.status",
    "SessionConfig": "lowtide.spark.session",
    "Stream": "lowtide.spark.pipeline.stream",
    "TrackedQuery": "lowtide.spark.pipeline.query",
    "class_archive_path": "lowtide.spark.session",
    "complete_below": "lowtide.spark.sinks.completeness",
    "read_complete": "lowtide.spark.sinks.cuts",
    "stop_between_batches": "lowtide.spark.pipeline.query",
    "write_archive_options": "lowtide.spark.session",
})
