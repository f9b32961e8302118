"""The segment graph derived from a pipeline description: DAG shapes and their errors,
without Spark (no session is started: the description is lazy)."""

from __future__ import annotations

import pytest

import lowtide
from lowtide.spark.pipeline.dag import PipelineShapeError, covers, derive


def ident(b):  # type: ignore[no-untyped-def]
    return b


def inbound(plan, name: str) -> set[str]:  # type: ignore[no-untyped-def]
    g = plan.graph
    return {g.names[j] for j in g.inbound[g.index(name)]}


def test_chain_keeps_its_names_and_order() -> None:
    pipe = lowtide.Pipeline(None)
    stream = pipe.read_log("/in").map(ident, name="parse").filter(ident, name="keep")
    assert stream.segment_names() == ["ingest", "parse", "keep", "sink"]
    plan = stream.plan()
    assert plan.sends_into == {"ingest": ("parse",), "parse": ("keep",), "keep": ("sink",)}


def test_two_generators_union_into_a_window() -> None:
    pipe = lowtide.Pipeline(None)
    a = pipe.generate(fronts=2)
    b = pipe.generate(fronts=2, first_front=2)
    win = a.union(b).window(10, key="front", name="win").agg(n="count")
    plan = win.plan()
    assert plan.graph.names == ("win", "win.state", "sink")
    assert plan.sends_into["gen:0-1"] == plan.sends_into["gen:2-3"] == ("win",)
    assert inbound(plan, "win") == set()  # a source segment: its bound is the fronts'


def test_union_of_tracked_branches_is_one_segment_with_two_senders() -> None:
    pipe = lowtide.Pipeline(None)
    a = pipe.read_log("/a", name="in_a").map(ident, name="pa")
    b = pipe.read_log("/b", name="in_b").map(ident, name="pb")
    plan = a.union(b).filter(ident, name="keep").plan("out")
    assert inbound(plan, "keep") == {"pa", "pb"}
    assert plan.sends_into["pa"] == plan.sends_into["pb"] == ("keep",)
    assert inbound(plan, "out") == {"keep"}
    assert plan.explain().splitlines()[-1].startswith("out ")


def test_union_straight_into_the_sink() -> None:
    pipe = lowtide.Pipeline(None)
    a = pipe.generate(fronts=1).map(ident, name="pa")
    b = pipe.generate(fronts=1, first_front=1).map(ident, name="pb")
    plan = a.union(b).plan()
    assert inbound(plan, "sink") == {"pa", "pb"}


def test_fan_out_to_two_sinks_sends_one_copy_into_each() -> None:
    pipe = lowtide.Pipeline(None)
    parsed = pipe.read_log("/in").map(ident, name="parse")
    plan = derive([(parsed.filter(ident, name="big"), "big_out"),
                   (parsed.map(ident, name="small"), "small_out")])
    assert plan.sends_into["parse"] == ("big", "small")
    assert plan.fan_out() == {"parse": ("big", "small")}
    assert inbound(plan, "big") == inbound(plan, "small") == {"parse"}
    assert plan.sinks == ("big_out", "small_out")
    assert plan.graph.names[:2] == ("ingest", "parse")


def test_explain_prints_the_graph(capsys: pytest.CaptureFixture[str]) -> None:
    pipe = lowtide.Pipeline(None)
    pipe.generate(fronts=2).map(ident, name="parse").explain()
    assert capsys.readouterr().out.splitlines() == [
        "parse <- fronts of gen:0-1", "sink  <- parse  [sink]"]


@pytest.mark.parametrize(("describe", "message"), [
    (lambda p: derive([(p.generate(fronts=1).map(ident, name="m"), "out"),
                       (p.generate(fronts=1, first_front=1).map(ident, name="n"), "out")]),
     "'out' is used twice"),
    (lambda p: p.generate(fronts=1).map(ident, name="m").union(
        p.generate(fronts=1, first_front=1).map(ident, name="m")).plan(),
     "'m' is used twice"),
    (lambda p: p.generate(fronts=2).union(p.generate(fronts=2, first_front=1)).plan(),
     "front 1 is in gen:.-. and gen:.-."),
    (lambda p: p.read_log("/a").union(p.read_log("/b")).plan(), "'ingest' is used twice"),
    (lambda p: (lambda s: s.union(s))(p.generate(fronts=1).map(ident, name="m")).plan(),
     "reaches 'sink' twice"),
    (lambda p: p.generate(fronts=1).union(
        p.generate(fronts=1, first_front=1).map(ident, name="m")).plan(),
     "generator gen:0-0 and tracked steps send into 'sink'"),
    (lambda p: p.generate(fronts=1).map(ident, name="sink").plan(), "'sink' is used twice"),
])
def test_shape_errors_are_one_line_where_described(describe, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PipelineShapeError, match=message.replace("(", r"\(")) as info:
        describe(lowtide.Pipeline(None))
    assert "\n" not in str(info.value)


def test_a_generator_feeds_one_segment() -> None:
    pipe = lowtide.Pipeline(None)
    src = pipe.generate(fronts=1)
    with pytest.raises(PipelineShapeError, match="a generator's fronts feed one segment"):
        derive([(src.map(ident, name="a"), "x"), (src.map(ident, name="b"), "y")])


def test_a_query_may_use_part_of_the_trackers_graph() -> None:
    pipe = lowtide.Pipeline(None)
    a = pipe.generate(fronts=1).map(ident, name="pa")
    b = pipe.generate(fronts=1, first_front=1).map(ident, name="pb")
    whole = pipe.plan((a, "out_a"), (b, "out_b")).graph
    assert covers(whole, a.graph("out_a")) and covers(whole, b.graph("out_b"))
    assert not covers(whole, a.graph("out_b"))  # out_b has another sender there
    assert not covers(whole, a.graph("sink"))


def test_fan_out_at_the_front_is_one_log_read_once_per_branch() -> None:
    pipe = lowtide.Pipeline(None)
    a = pipe.read_log("/in", name="in_a").map(ident, name="pa")
    b = pipe.read_log("/in", name="in_b").filter(ident, name="pb")
    plan = pipe.plan((a, "out_a"), (b, "out_b"))
    assert plan.fan_out() == {}
    assert inbound(plan, "in_a") == inbound(plan, "in_b") == set()  # the fronts'
    assert inbound(plan, "out_a") == {"pa"} and inbound(plan, "out_b") == {"pb"}
    assert covers(plan.graph, a.graph("out_a")) and covers(plan.graph, b.graph("out_b"))


@pytest.mark.parametrize("shared", ["source", "step"])
def test_a_sender_shared_by_two_sinks_is_refused_where_planned(shared: str) -> None:
    pipe = lowtide.Pipeline(None)
    src = pipe.read_log("/in")
    up = src if shared == "source" else src.map(ident, name="parse")
    with pytest.raises(PipelineShapeError, match=r"feeds big, small: a step or source "
                       r"shared by two branches is not built in Spark; read the log once "
                       r"per branch") as info:
        pipe.plan((up.filter(ident, name="big"), "x"), (up.map(ident, name="small"), "y"))
    assert "\n" not in str(info.value)
