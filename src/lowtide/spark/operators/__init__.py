"""Tracked steps: map, flat_map and filter over Arrow batches (:mod:`.tracked`), and
exact keyed windows (:mod:`.windows` describes them, :mod:`.window_state` runs them)."""

from lowtide.spark.operators.tracked import OpRuntime, OpSpec, apply_op, operator_id, task_function
from lowtide.spark.operators.window_state import build_window
from lowtide.spark.operators.windows import ROCKSDB, WindowedStream, WindowSpec, duration_ms

__all__ = [
    "ROCKSDB",
    "OpRuntime",
    "OpSpec",
    "WindowSpec",
    "WindowedStream",
    "apply_op",
    "build_window",
    "duration_ms",
    "operator_id",
    "task_function",
]
