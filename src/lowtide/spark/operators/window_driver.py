"""An exact window as its query's last step, its results from the driver: Spark
aggregates, the sink's ``foreachBatch`` emits each window once it is complete (for a
window with key ranges, rule 15, once its key range is).

::

    rows, received (each in its key range's cell) and stamped   (window_input)
         .groupBy(keys, window).agg(...)   (with key ranges: min/max of the rows' range)
                                           in update mode        (window_plan, in the JVM)
         --> each batch: the (key, window)s whose values changed, one row each
    foreachBatch, on the driver: WindowFinals per key range      (window_finals)
         --> a (key, window)'s result once its range's min time passes its end
         --> the sink's own function, then its acks          (speculative_driver)

Why the driver. The emit step of :mod:`.window_plan` (append mode) hands on a window
once Spark's watermark passes its end, and Spark moves its watermark between batches,
from the stamps of the batch before: a window whose last rows a batch reads comes out
in the next batch, or the one after. Here Spark keeps the partial aggregates and hands
on, in update mode, each batch's changed (key, window)s with their running values; the
driver step keeps the latest values of every open (key, window) and reads the min
times once the batch's tasks are done, so a window whose last rows this batch read
comes out in this batch. It is the speculative window's driver step
(:mod:`.speculative_driver`) with its finals alone, in the columns of the window's
results (:func:`.window_state.output_schema`): the same state file per batch, the
same one keyed ack batch per batch, the same holds, and the same reason a batch run
again emits the same rows (rules 5 and 6).

Where it runs. Only where the sink runs ``foreachBatch`` anyway (Parquet, a table, a
function): the step costs the driver a few ms per batch, and ``write_parquet`` writes
its few rows on the driver with no Spark job, which the emit step's plan needs.
Spark's call of ``foreachBatch`` costs about 70 ms a batch on the 2-core machine, so
into the null sink (Spark's ``noop``, nothing on the driver) a window without key
ranges keeps the emit step. Steps after the window, a caller's own sink (``build()``),
or a checkpoint that ran another plan (chosen once per checkpoint) keep it too; a
window with key ranges then runs on the keyed runtime (:mod:`.window_state`).

Key ranges. Spark's watermark is one per query: driven by the stamps (the whole
segment's min time), it could emit a window only once every range is complete, the
lagging one too. Here each range has its own min time and state, and its holds descend
from a parent of its own (:func:`.state_clock.range_parent`), so what one range emits
never releases a hold another still needs. A row's range is its front's
(:func:`lowtide.spark.tracking.key_ranges.row_ranges`): the senders' receive step acks
each row in its range's cell, and the aggregation keeps the least and the greatest
range of each (key, window)'s rows; a key whose rows come from two ranges is refused
(its window could be emitted before the other range's rows), as on the keyed runtime.
"""

from __future__ import annotations

from typing import Any

from lowtide.spark.operators.speculative_plan import changed_rows, keys_ddl
from lowtide.spark.operators.window_finals import WindowFinals
from lowtide.spark.operators.window_plan import QueryWindows
from lowtide.spark.operators.window_state import output_schema
from lowtide.spark.operators.windows import WindowSpec
from lowtide.spark.tracking.column import TRACK_COL
from lowtide.spark.tracking.key_ranges import require_front, source_ranges
from lowtide.spark.tracking.transport import TrackerRef


def build_driver_window(df: Any, spec: WindowSpec, windows: QueryWindows, ref: TrackerRef,
                        out_segment: str, op_id: int) -> Any:
    """The DataFrame of a window whose results come from the driver (the module
    docstring): Spark's changed rows; its driver step joins ``windows.changelogs``."""
    from lowtide.spark.operators.speculative_driver import DriverChangelog

    assert windows.checkpoint is not None
    ranges = None
    if spec.key_ranges:
        require_front(f"window {spec.name!r}", df.columns)
        ranges = source_ranges(ref.graph, ref.graph.index(spec.name))
    prepared, aggs, fields = changed_rows(df, spec, windows, ref, op_id, ranges)
    delta = ref.grid.delta_ms
    logic = WindowFinals(aggs, spec.size_ms // delta, delta, spec.keys)
    ddl = f"{keys_ddl(spec.keys, fields)}, {output_schema(spec, aggs)}, {TRACK_COL} long"
    windows.changelogs.append(DriverChangelog(spec.name, logic, ddl, ref, out_segment,
                                              op_id, windows.checkpoint,
                                              key_ranges=spec.key_ranges))
    return prepared
