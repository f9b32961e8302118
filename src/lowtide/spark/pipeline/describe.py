"""What a user writes, made a step's description: durations, column names, a join's
keys, a window's aggregates. Each mistake is one :class:`PipelineShapeError` (a
``lowtide.LowtideError`` and a ``ValueError``) raised right where the pipeline is
described, naming the step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from lowtide.core.errors import LowtideError
from lowtide.spark.operators.joins import JoinCondition, JoinSpec
from lowtide.spark.operators.windows import duration_ms, parse_keys
from lowtide.spark.pipeline.dag import PipelineShapeError

if TYPE_CHECKING:
    from lowtide.spark.pipeline.stream import Stream

Keys = str | list[str] | tuple[str, ...]
#: a window aggregate: "count", (column, fn) or (column, "percentile", p)
AggSpec = str | tuple[str, str] | tuple[str, str, float]
T = TypeVar("T")


def described(build: Callable[[], T]) -> T:
    """``build()``, with a bare ``ValueError`` of the description made a
    :class:`PipelineShapeError` (same message)."""
    try:
        return build()
    except LowtideError:
        raise
    except ValueError as err:
        raise PipelineShapeError(str(err)) from None


def duration_of(duration: str | int | None, what: str = "duration") -> int:
    """A duration in ms: ``"15 minutes"``, ``"-5 seconds"`` or ms; None is 0."""
    if duration is None:
        return 0
    text = duration.strip() if isinstance(duration, str) else duration
    try:
        if isinstance(text, str) and text.startswith("-"):
            return -duration_ms(text[1:])
        return duration_ms(text)
    except ValueError as err:
        raise PipelineShapeError(f"{what}: {err} (e.g. '15 minutes', '-5 seconds')") from None


def names_of(keys: Any, what: str) -> tuple[str, ...]:
    """Column names given as one name or a list; ``what`` names the step."""
    return described(lambda: parse_keys(keys, what))


def with_keys(spec: JoinSpec, on: Any, left_on: Any, right_on: Any) -> JoinSpec:
    """``spec`` with its keys: ``on`` names or a Column condition, or ``left_on`` and
    ``right_on`` (as many on each side)."""
    what = f"join {spec.name!r}"
    if (on is None) == (left_on is None and right_on is None):
        raise PipelineShapeError(f"{what}: give on= (names or a Column condition) or "
                                 "left_on= with right_on=")
    if on is not None:
        if isinstance(on, str | list | tuple):
            return replace(spec, keys=names_of(on, what))
        return replace(spec, condition=JoinCondition(on))
    left, right = names_of(left_on, what), names_of(right_on, what)
    if len(left) != len(right):
        raise PipelineShapeError(f"{what}: left_on has {len(left)} key(s), right_on "
                                 f"{len(right)}: give them pairwise")
    return replace(spec, keys=left, right_keys=right)


@dataclass(frozen=True)
class Aggregated:
    """``stream.groupBy(...)`` or ``stream.session_window(...)``: finish it with
    :meth:`agg` or :meth:`count` (see :mod:`lowtide.spark.operators.running` and
    :mod:`lowtide.spark.operators.sessions`)."""

    grouped: Any  # an operators description with .agg(**aggs) -> Stream

    def agg(self, **aggs: AggSpec) -> Stream:
        """``n="count"``, ``total=("amount", "sum")``, ``p90=("amount", "percentile",
        0.9)``; fn one of count, sum, min, max, mean (avg), first, last,
        count_distinct, percentile; typed as Spark types them."""
        stream: Stream = described(lambda: self.grouped.agg(**aggs))
        return stream

    def count(self) -> Stream:
        """One aggregate, ``count``: the rows."""
        return self.agg(count="count")


@dataclass(frozen=True)
class Windowed(Aggregated):
    """``stream.window(...)``: finish it with :meth:`agg`, :meth:`count` or
    :meth:`apply` (see :mod:`lowtide.spark.operators.windows`)."""

    def apply(self, fn: Callable[[Any], Any], schema: str) -> Stream:
        """``fn(rows: pandas.DataFrame) -> dict`` (one result row) or a DataFrame,
        columns as in the DDL ``schema``; called once per complete window."""
        stream: Stream = described(lambda: self.grouped.apply(fn, schema))
        return stream
