"""Mistakes in a description are one-line ``lowtide.LowtideError``s (and
``ValueError``s, as before) raised by the call that describes the step, without Spark
(no session: the description is lazy); the verbs PySpark users reach for describe the
steps they should."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

import lowtide
from lowtide.spark.operators.dedup import DedupSpec
from lowtide.spark.operators.frames import FrameSpec
from lowtide.spark.operators.joins import JoinSpec
from lowtide.spark.pipeline.describe import Windowed


def ident(b):  # type: ignore[no-untyped-def]
    return b


def stream(pipe: Any = None, front: int = 0) -> Any:
    pipe = pipe or lowtide.Pipeline(None)
    return pipe.generate(fronts=1, first_front=front).map(ident, "user string, n long",
                                                          name=f"parse{front}")


def error(describe: Callable[[Any, Any], Any]) -> str:
    s = stream()
    with pytest.raises(lowtide.LowtideError) as info:
        describe(s, stream(s.pipeline, 1))
    assert isinstance(info.value, ValueError)
    text = str(info.value)
    assert "\n" not in text
    return text


def test_each_mistake_is_one_line_where_it_is_described() -> None:
    cases: list[tuple[Callable[[Any, Any], Any], str]] = [
        (lambda s, o: s.filter("n > 0"), r"filter\(\) takes a function of an Arrow batch .*"
                                      r"got str: for a SQL condition use where\('n > 0'\)"),
        (lambda s, o: s.join(o, within="1 second"), r"join 'join\d': give on="),
        (lambda s, o: s.join(o, left_on=["a", "b"], right_on="c", within=100),
         r"left_on has 2 key\(s\), right_on 1"),
        (lambda s, o: s.join(o, on="user", upper="1 minute"), r"give both lower= and upper="),
        (lambda s, o: s.join(o, on="user", lower="a while", upper=10),
         r"join 'join\d': lower=: not a duration: 'a while'"),
        (lambda s, o: s.join(o, on="user", within=100, how="sideways"), r"how='sideways'"),
        (lambda s, o: s.dropDuplicates("user", within="15 ms"),
         r"dropDuplicates '\w+': within=15 ms must be a non-negative multiple of delta_ms=10"),
        (lambda s, o: s.window("1 second", key="user").agg(), r"agg\(\) needs at least one"),
        (lambda s, o: s.window("1 second", key="user", slide="300 ms"), r"multiple of the slide"),
        (lambda s, o: s.window("1 second", key="user").agg(user="count"), r"'user' is taken"),
        (lambda s, o: s.stateful(ident, "x long", key=[], name="run"), r"stateful 'run' key \[\]"),
    ]
    for describe, pattern in cases:
        assert re.search(pattern, error(describe)), error(describe)


def test_the_verbs_describe_their_steps() -> None:
    s = stream()
    assert s.withWatermark("ts", "10 minutes") is s  # unneeded: completeness is exact
    renamed = s.withColumnRenamed("n", "m").drop("m").selectExpr("upper(user) AS u")
    assert [(st.kind, st.args) for st in renamed.steps[1:]] == [
        ("rename", ("n", "m")), ("drop", ("m",)), ("select_expr", ("upper(user) AS u",))]
    assert all(isinstance(st, FrameSpec) for st in renamed.steps[1:])
    assert renamed.segment_names() == ["parse0", "sink"]  # rows 1:1: no segment of their own
    first = s.drop_duplicates(["user"], within="1 second", name="d")
    assert first.steps[-1] == DedupSpec("d", ("user",), 100)
    assert first.segment_names() == ["parse0", "d", "d.state", "sink"]
    assert s.withColumn("x", None).steps[-1].kind == "with_column"
    windowed = s.window("1 second", key="user")
    assert isinstance(windowed, Windowed)
    assert windowed.agg(n="count", top=("n", "max")).segment_names()[-1] == "sink"


def test_join_keys_and_bounds_as_written() -> None:
    s = stream()
    o = stream(s.pipeline, 1)
    j = s.join(o, left_on="user", right_on="who", lower="0 seconds",
               upper="15 minutes", how="leftOuter", name="j").steps[0]
    assert j == JoinSpec("j", ("user",), 0, 900_000, "left", right_keys=("who",))
    j = s.join(o, "user", "left_anti", lower="-5 seconds", upper="-10 ms").steps[0]
    assert (j.keys, j.lower_ms, j.upper_ms, j.how) == (("user",), -5000, -10, "anti")
