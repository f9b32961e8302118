"""Exact windows with key ranges planned in Spark's JVM (rule 15): Spark aggregates, the
driver emits each key range's windows once that range is complete.

::

    rows, received (each in its key range's cell) and stamped   (window_input)
         .groupBy(keys, window).agg(..., min/max of the rows' key range)
                                           in update mode        (window_plan, in the JVM)
         --> each batch: the (key, window)s whose values changed, one row each
    foreachBatch, on the driver: ChangelogLogic(finals_only) per key range
         --> a (key, window)'s result once its range's min time passes its end
         --> the sink's own function, then its acks          (speculative_driver)

Spark's watermark is one per query: driven by the stamps (the whole segment's min
time), it can emit a window only once every range is complete, the lagging one
too. So Spark keeps the partial aggregates and hands on, in update mode, each
micro-batch's changed (key, window)s with their running values; the driver keeps the
latest values of every open (key, window) and emits its result when the min time of
its key range passes its end. It is the speculative window's driver step
(:mod:`.speculative_driver`) with its finals alone, in the columns of the window's
results (:func:`.window_state.output_schema`): the same state file per batch, the
same one keyed ack batch per batch, the same holds, and the same reason a batch run
again emits the same rows (rules 5 and 6). Its holds are per key range (each range's
descend from one parent of their own: :func:`.state_clock.range_parent`), so what one
range emits never releases a hold another still needs.

A row's range is its front's (:func:`lowtide.spark.tracking.key_ranges.row_ranges`):
the senders' receive step acks each row in its range's cell, and the aggregation
keeps the least and the greatest range of each (key, window)'s rows; a key whose
rows come from two ranges is refused (its window could be emitted before the other
range's rows), as on the keyed runtime.

Where the window is not the query's last step, or its checkpoint already ran the
keyed runtime, it runs there (:mod:`.window_state`).
"""

from __future__ import annotations

from typing import Any

from lowtide.spark.operators.speculative_plan import ChangelogLogic, changed_rows, keys_ddl
from lowtide.spark.operators.window_plan import QueryWindows
from lowtide.spark.operators.window_state import output_schema
from lowtide.spark.operators.windows import WindowSpec
from lowtide.spark.tracking.column import TRACK_COL
from lowtide.spark.tracking.key_ranges import require_front, source_ranges
from lowtide.spark.tracking.transport import TrackerRef


def build_ranged_window(df: Any, spec: WindowSpec, windows: QueryWindows, ref: TrackerRef,
                        out_segment: str, op_id: int) -> Any:
    """The DataFrame of a window with key ranges planned in the JVM (the module
    docstring): Spark's changed rows; its driver step joins ``windows.changelogs``."""
    from lowtide.spark.operators.speculative_driver import DriverChangelog

    assert windows.checkpoint is not None
    require_front(f"window {spec.name!r}", df.columns)
    ranges = source_ranges(ref.graph, ref.graph.index(spec.name))
    prepared, aggs, fields = changed_rows(df, spec, windows, ref, op_id, ranges)
    delta = ref.grid.delta_ms
    logic = ChangelogLogic(aggs, spec.size_ms // delta, delta, 0, spec.keys,
                           finals_only=True)
    ddl = f"{keys_ddl(spec.keys, fields)}, {output_schema(spec, aggs)}, {TRACK_COL} long"
    windows.changelogs.append(DriverChangelog(spec.name, logic, ddl, ref, out_segment,
                                              op_id, windows.checkpoint,
                                              key_ranges=spec.key_ranges))
    return prepared
