"""Starting the driver's Python planner processes before a query needs them.

For each kind of call Spark makes on the driver about a Python data source (create
it, plan its read, plan a write, commit a batch write) it starts a daemon of that
worker module and forks a worker from it, the first time the call is made: at a
query's start and in its first micro-batch, one after the other. Reading from and
writing to an empty Python data source once (:func:`warm_planners`, run by
``prewarm`` in the background) starts them beforehand; Spark keeps each worker for
the next call of its kind (``spark.python.worker.reuse``), and the query's calls
reuse them: measured with strace, the query forks no new planner worker after it.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceWriter
from pyspark.sql.datasource import WriterCommitMessage as Committed

WARM_SOURCE = "lowtide_warm"


class _Reader(DataSourceReader):  # type: ignore[misc]
    def read(self, partition: Any) -> Any:
        return iter(())


class _Writer(DataSourceWriter):  # type: ignore[misc]
    def write(self, iterator: Any) -> Committed:
        return Committed()


class WarmSource(DataSource):  # type: ignore[misc]
    """Reads no rows, and accepts a write of rows it drops."""

    @classmethod
    def name(cls) -> str:
        return WARM_SOURCE

    def schema(self) -> str:
        return "x long"

    def reader(self, schema: Any) -> _Reader:
        return _Reader()

    def writer(self, schema: Any, overwrite: bool) -> _Writer:
        return _Writer()


def warm_planners(spark: Any) -> None:
    """Read from and write to :class:`WarmSource` once (its rows go nowhere)."""
    spark.dataSource.register(WarmSource)
    spark.read.format(WARM_SOURCE).load().collect()
    spark.range(0, 1, 1, 1).write.format(WARM_SOURCE).mode("append").save()
