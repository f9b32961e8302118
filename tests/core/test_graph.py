"""Segment graph: validation and stable topological indices."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.core.errors import GraphError, ProtocolError, UnknownSegment
from lowtide.core.graph import MAX_KEY_RANGES, SegmentGraph, SegmentSpec


def test_worked_example() -> None:
    g = SegmentGraph.of(("parse", ()), ("filter", ("parse",)), ("sink", ("filter",)))
    assert g.names == ("parse", "filter", "sink")
    assert g.inbound == ((), (0,), (1,))
    assert len(g) == 3
    assert [g.index(n) for n in g.names] == [0, 1, 2]
    assert [g.is_source(i) for i in range(3)] == [True, False, False]
    assert g.sinks() == (2,)


def test_inbound_is_indexed_before_outbound_whatever_the_declaration_order() -> None:
    g = SegmentGraph.of(("sink", ("join",)), ("join", ("a", "b")), ("b", ()), ("a", ()))
    assert g.names == ("b", "a", "join", "sink")
    assert g.inbound[g.index("join")] == (0, 1)
    assert g.inbound[g.index("sink")] == (g.index("join"),)
    assert g.sinks() == (3,)


def test_ties_are_broken_by_declaration_order_level_by_level() -> None:
    # Kahn's algorithm in rounds: every segment ready in a round, in declaration order.
    g = SegmentGraph.of(("a", ()), ("b", ("a",)), ("c", ()))
    assert g.names == ("a", "c", "b")
    g2 = SegmentGraph.of(("c", ()), ("b", ("a",)), ("a", ()))
    assert g2.names == ("c", "a", "b")


def test_fan_out_fan_in_and_several_sinks() -> None:
    g = SegmentGraph.of(
        ("src", ()), ("left", ("src",)), ("right", ("src",)), ("both", ("left", "right"))
    )
    assert g.inbound == ((), (0,), (0,), (1, 2))
    assert g.sinks() == (3,)
    g2 = SegmentGraph.of(("src", ()), ("x", ("src",)), ("y", ("src",)))
    assert g2.sinks() == (1, 2)


def test_duplicate_inbound_names_collapse() -> None:
    g = SegmentGraph.of(("a", ()), ("b", ("a", "a")))
    assert g.inbound == ((), (0,))


def test_spec_objects_and_tuples_are_equivalent() -> None:
    g1 = SegmentGraph.of(SegmentSpec("a"), SegmentSpec("b", ("a",)))
    g2 = SegmentGraph.of(("a", []), ("b", ["a"]))
    assert g1 == g2
    assert g1.fingerprint() == g2.fingerprint()


def test_indices_and_fingerprint_are_reproducible() -> None:
    specs = (("s", ()), ("t", ()), ("u", ("t", "s")), ("v", ("u",)), ("w", ("s",)))
    first = SegmentGraph.of(*specs)
    for _ in range(3):
        again = SegmentGraph.of(*specs)
        assert again.names == first.names
        assert again.inbound == first.inbound
        assert again.fingerprint() == first.fingerprint()
    assert len(first.fingerprint()) == 16


def test_fingerprint_tells_graphs_apart() -> None:
    chain = SegmentGraph.of(("a", ()), ("b", ("a",)))
    two_sources = SegmentGraph.of(("a", ()), ("b", ()))
    renamed = SegmentGraph.of(("a", ()), ("c", ("a",)))
    prints = {g.fingerprint() for g in (chain, two_sources, renamed)}
    assert len(prints) == 3


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ((SegmentSpec("a", ("a",), key_ranges=2),), "in a cycle and has key ranges"),
        ((SegmentSpec("a", (), key_ranges=1),), "key_ranges=1"),
        ((SegmentSpec("a", (), key_ranges=MAX_KEY_RANGES + 1),), "key_ranges="),
        ((SegmentSpec("a", (), front_ranges=((1, (0,)),)),), "no key_ranges"),
        ((SegmentSpec("a", (), 2, ((1, (2,)),)),), "feeds ranges"),
        ((("a", ()), ("b", ("nope",))), "unknown inbound"),
        ((("a", ()), ("a", ())), "declared twice"),
        ((("", ()),), "non-empty"),
        ((), "at least one"),
    ],
)
def test_invalid_graphs_are_refused(
    specs: tuple[tuple[str, tuple[str, ...]], ...], message: str
) -> None:
    with pytest.raises(GraphError, match=message):
        SegmentGraph.of(*specs)


def test_graph_errors_are_not_protocol_errors() -> None:
    # a bad graph is a configuration error, not a message to refuse
    assert not issubclass(GraphError, ProtocolError)
    assert issubclass(GraphError, ValueError)


def test_unknown_names_raise_unknown_segment() -> None:
    g = SegmentGraph.of(
        ("a", ()),
    )
    with pytest.raises(UnknownSegment, match="nope"):
        g.index("nope")
    assert issubclass(UnknownSegment, ProtocolError)


@st.composite
def dags(draw: st.DrawFn) -> list[tuple[str, tuple[str, ...]]]:
    n = draw(st.integers(1, 7))
    names = [f"n{i}" for i in range(n)]
    specs = []
    for i, name in enumerate(names):
        ups = draw(st.lists(st.sampled_from(names[:i]), max_size=3)) if i else []
        specs.append((name, tuple(ups)))
    return draw(st.permutations(specs))


@settings(max_examples=150, deadline=None)
@given(dags())
def test_random_dags_get_a_topological_order(specs: list[tuple[str, tuple[str, ...]]]) -> None:
    g = SegmentGraph.of(*specs)
    assert sorted(g.names) == sorted(name for name, _ in specs)
    declared = dict(specs)
    for i, name in enumerate(g.names):
        assert all(u < i for u in g.inbound[i])
        assert {g.names[u] for u in g.inbound[i]} == set(declared[name])
        assert list(g.inbound[i]) == sorted(set(g.inbound[i]))
    assert SegmentGraph.of(*specs) == g


def _rounds_order(specs: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    """The order indices have always had (and state dirs were written with): Kahn's
    algorithm in rounds, each round in declaration order. Quadratic; a reference."""
    pending = {name: set(ups) for name, ups in specs}
    order: list[str] = []
    while pending:
        ready = [name for name, _ in specs if name in pending and not pending[name]]
        for name in ready:
            del pending[name]
            order.append(name)
        for ups in pending.values():
            ups.difference_update(ready)
    return order


@settings(max_examples=200, deadline=None)
@given(dags())
def test_indices_are_those_of_the_rounds_algorithm(
    specs: list[tuple[str, tuple[str, ...]]],
) -> None:
    """Invariant: the linear sort gives every graph the same indices as before, so
    stored state and fingerprints stay valid."""
    assert list(SegmentGraph.of(*specs).names) == _rounds_order(specs)


@pytest.mark.timeout(20)
def test_a_large_graph_is_checked_in_linear_time() -> None:
    # declared sink first: the rounds algorithm rescans every segment per round,
    # 20,000 rounds x 20,000 segments; a linear sort does 20,000 steps
    n = 20_000
    specs = [(f"s{i}", (f"s{i - 1}",) if i else ()) for i in reversed(range(n))]
    g = SegmentGraph.of(*specs)
    assert g.names[0] == "s0" and g.names[-1] == f"s{n - 1}"
    assert g.index(f"s{n - 1}") == n - 1 and f"s{n // 2}" in g
    cyclic = SegmentGraph.of(*specs[:-1], ("s0", (f"s{n - 1}",)))  # one loop of all
    assert cyclic.members(0) == tuple(range(n)) and cyclic.takes_fronts(n // 2)


def test_a_cycle_is_one_component_ordered_after_what_feeds_it() -> None:
    # declared out of order: the loop's members sit next to each other, after "in"
    g = SegmentGraph.of(("retry", ("work",)), ("out", ("work",)),
                        ("work", ("in", "retry")), ("in", ()))
    assert g.names == ("in", "retry", "work", "out")  # a loop keeps declaration order
    work, retry = g.index("work"), g.index("retry")
    assert g.members(work) == g.members(retry) == (retry, work)
    assert g.outside(retry) == (g.index("in"),) and not g.takes_fronts(work)
    assert g.is_cyclic(work) and not g.is_cyclic(g.index("out"))
    assert g.sinks() == (g.index("out"),) and not g.simple
    self_loop = SegmentGraph.of(("a", ("a",)))
    assert self_loop.is_cyclic(0) and self_loop.takes_fronts(0) and self_loop.sinks() == (0,)


def test_key_ranges_have_cells_past_the_segments_and_names() -> None:
    g = SegmentGraph.of(SegmentSpec("src", (), key_ranges=4, front_ranges=((7, (3,)),)),
                        ("mid", ("src",)), SegmentSpec("sink", ("mid",), key_ranges=2))
    assert g.n_cells == 3 + 4 + 2 and not g.simple
    assert [g.cell(0, r) for r in range(4)] == [3, 4, 5, 6] and g.cell(2, 1) == 8
    assert g.ranges_of(0) == 4 and g.ranges_of(1) == 0 and g.fronts_of(0) == {7: {3}}
    assert g.range_name(0, 2) == "src#2" and g.resolve("src#2") == (0, 2)
    assert g.resolve("mid") == (1, None)
    with pytest.raises(UnknownSegment):
        g.resolve("src#4")
    assert g.fingerprint() != SegmentGraph.of(("src", ()), ("mid", ("src",)),
                                              ("sink", ("mid",))).fingerprint()
