"""A front's agent is an interface (:class:`FrontAgent`), not a set of methods probed
for: the service's agent and the tests' in-process one both implement all of it, and no
product module of the sources or the pipeline asks an agent (or a tracker) whether it
has a method (issue 34 review: the clock's ``on_update``, ``_leave``'s
``unregister_front`` and five more were probed with hasattr/getattr)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lowtide.spark.sources import clock
from lowtide.spark.sources.front_agent import FrontAgent
from tests.spark.helpers import CoreAgent

SPARK = Path(__file__).parents[3] / "src" / "lowtide" / "spark"
PROBES = ("hasattr", "getattr")


def members(protocol: type) -> set[str]:
    names = set()
    for klass in protocol.__mro__:
        if klass is object or klass.__name__ in ("Protocol", "Generic"):
            continue
        names |= {n for n in vars(klass) if not n.startswith("_")}
        names |= set(getattr(klass, "__annotations__", {}))
    return names


@pytest.mark.parametrize("agent", ["service", "core"])
def test_both_agents_implement_every_method_a_front_calls(agent: str) -> None:
    from lowtide.core.graph import SegmentGraph
    from lowtide.service import Agent

    needed = members(FrontAgent) | members(clock.Pushing)
    if agent == "service":  # its graph is set when it connects
        subject: object = Agent
        needed.discard("graph")
    else:
        subject = CoreAgent(SegmentGraph.of(("src", ())))
    assert sorted(n for n in needed if not hasattr(subject, n)) == []


def probes(path: Path) -> list[str]:
    """hasattr(x, ...) and getattr(x, ..., default) where x names an agent or tracker."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in PROBES and node.args):
            continue
        if node.func.id == "getattr" and len(node.args) < 3:
            continue
        subject = ast.unparse(node.args[0])
        if "agent" in subject or "tracker" in subject:
            out.append(f"{path.relative_to(SPARK)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_product_module_probes_an_agent_for_a_method() -> None:
    found = [p for folder in ("sources", "pipeline")
             for path in sorted((SPARK / folder).glob("*.py")) for p in probes(path)]
    assert found == []
