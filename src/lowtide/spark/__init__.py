"""PySpark tracked pipelines: fronts and the ingest log, tracked sources, operators and
sinks, the pipeline description, and ``lowtide bench spark``. See docs/spark.md."""
