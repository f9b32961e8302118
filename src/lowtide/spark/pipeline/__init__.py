"""The pipeline description and its queries: :class:`Pipeline`, :class:`Stream`, its
segment graph (:class:`SegmentPlan`), its writer (``stream.writeStream``,
:class:`TrackedStreamWriter`), :class:`TrackedQuery`, the progress they report, and
replay by time (:mod:`.replay`: :class:`Loss`) and repairing a loss with it
(:mod:`.repair`: :class:`Target`)."""

from lowtide.spark.pipeline.batches import last_batch_id
from lowtide.spark.pipeline.builder import Built, Pipeline, TrackerNotStarted
from lowtide.spark.pipeline.dag import PipelineShapeError, SegmentPlan, derive
from lowtide.spark.pipeline.data_sources import register_sources
from lowtide.spark.pipeline.describe import Aggregated, Windowed
from lowtide.spark.pipeline.freshness import FreshnessListener, WindowLate
from lowtide.spark.pipeline.handle import TrackerHandle
from lowtide.spark.pipeline.monitoring import CompletenessListener, ProgressMetrics
from lowtide.spark.pipeline.query import (
    QueryFailed,
    TrackedQuery,
    await_idle,
    await_jobs_gone,
    startup_phase,
    stop_between_batches,
)
from lowtide.spark.pipeline.repair import Repaired, Target
from lowtide.spark.pipeline.replay import Loss, Replayed, ReplayRefused
from lowtide.spark.pipeline.status import PipelineStatus, SegmentProgress, status_of
from lowtide.spark.pipeline.stream import Stream
from lowtide.spark.pipeline.write_stream import TrackedStreamWriter

__all__ = [
    "Aggregated",
    "Built",
    "CompletenessListener",
    "FreshnessListener",
    "Loss",
    "Pipeline",
    "PipelineShapeError",
    "PipelineStatus",
    "ProgressMetrics",
    "QueryFailed",
    "Repaired",
    "ReplayRefused",
    "Replayed",
    "SegmentPlan",
    "SegmentProgress",
    "Stream",
    "Target",
    "TrackedQuery",
    "TrackedStreamWriter",
    "TrackerHandle",
    "TrackerNotStarted",
    "WindowLate",
    "Windowed",
    "await_idle",
    "await_jobs_gone",
    "derive",
    "last_batch_id",
    "register_sources",
    "startup_phase",
    "status_of",
    "stop_between_batches",
]
