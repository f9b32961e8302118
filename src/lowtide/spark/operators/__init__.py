"""Tracked steps: map, flat_map and filter over Arrow batches (:mod:`.tracked`),
DataFrame-native steps evaluated by the JVM (:mod:`.frames`), and the exact stateful
steps, each a slot logic (:mod:`.slot_logic`) on one keyed runtime (:mod:`.keyed_state`,
:mod:`.state_processor`, :mod:`.state_clock`): exact keyed windows (:mod:`.windows`
describes them, :mod:`.window_state` is their logic, :mod:`.window_aggs` computes their
typed aggregates), a user's ``stateful`` fold, and the joins (:mod:`.joins`)."""

from lowtide.spark.operators.frames import FrameSpec, StepError
from lowtide.spark.operators.speculative_plan import on_keyed_runtime
from lowtide.spark.operators.state_clock import ROCKSDB, StateClock
from lowtide.spark.operators.tracked import OpRuntime, OpSpec, apply_op, operator_id, task_function
from lowtide.spark.operators.window_state import build_window
from lowtide.spark.operators.windows import WindowedStream, WindowSpec, duration_ms

__all__ = [
    "ROCKSDB",
    "FrameSpec",
    "OpRuntime",
    "OpSpec",
    "StateClock",
    "StepError",
    "WindowSpec",
    "WindowedStream",
    "apply_op",
    "build_window",
    "duration_ms",
    "on_keyed_runtime",
    "operator_id",
    "task_function",
]
