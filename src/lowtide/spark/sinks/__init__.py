"""Tracked sinks: receipt is acked only after the batch is committed.

The sink's input segment is the last segment of the pipeline, so its min time is
end-to-end completeness: every row with time < t has been committed at the sink.

Two mechanisms:

* :class:`TrackedForeachBatch` wraps a ``foreachBatch`` function. It caches the
  batch, computes the receive-acks in the JVM (grouped by the slot bits of
  ``lt_track``, with ``bit_xor`` and ``count``; no Python pass over the rows), runs
  the user's function (which commits), then sends one batch keyed
  ``(query id, batch id, sink segment, 0)``.
  The console sink is built on it, and so is the null sink after an untracked step
  (no user function: the aggregation alone). The null sink right after a tracked
  operator is no sink object at all: Spark's ``noop`` sink, and the operator's
  tasks ack the rows as received (see ``Stream.to_null``).
* ``write_parquet`` (:class:`ParquetSink`, :mod:`.parquet`): a ``foreachBatch``
  function too, of one Spark job a batch: each task writes its rows to a Parquet file
  aside and returns its per-time XORs; the driver publishes the files under names that
  carry the query's id (a rerun from a new checkpoint never replaces an earlier run's
  files; a re-run batch whose files hold exactly its rows is not written again:
  :mod:`.batches`) and then sends the acks.
* Rows in time order (``Stream.foreach_complete``, :mod:`.ordered`): staged, then
  handed on per completed range of global time; reading a speculative window's
  changelog (:mod:`.changelog`).
* Tables (``Stream.write_table``, :mod:`.tables`): Delta or Parquet, the labels kept,
  the completeness published over every tracked writer (:mod:`.completeness`), and
  consistent cuts of them at a min time (:mod:`.cuts`).

With ``keep_tracking_columns`` the output has ``lt_time`` (the row's full slot) and
``lt_ack`` (its 32-bit ack id) instead of the packed ``lt_track``.

A failed batch sends nothing: the acks of a batch go out only after its commit. (The
null sink after a tracked operator commits nothing and is no object here: that
operator's tasks ack it, see ``lowtide.spark.operators.tracked.ack_null_sink``.)
"""

from lowtide.spark.sinks.batches import BatchRewritten
from lowtide.spark.sinks.changelog import apply_changelog, finals, merge_sql
from lowtide.spark.sinks.cuts import Cut, CutRefused, cut, read_complete
from lowtide.spark.sinks.foreach import (
    TrackedForeachBatch,
    append_trace,
    console_writer,
    unpacked_columns,
)
from lowtide.spark.sinks.ordered import CompleteRanges, ordered_writer
from lowtide.spark.sinks.parquet import ParquetSink
from lowtide.spark.sinks.table_formats import RowsBelowTable, retire_writer

__all__ = [
    "BatchRewritten",
    "CompleteRanges",
    "Cut",
    "CutRefused",
    "ParquetSink",
    "RowsBelowTable",
    "TrackedForeachBatch",
    "append_trace",
    "apply_changelog",
    "console_writer",
    "cut",
    "finals",
    "merge_sql",
    "ordered_writer",
    "read_complete",
    "retire_writer",
    "unpacked_columns",
]
