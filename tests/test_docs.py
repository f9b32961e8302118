"""Every ```python block in README.md and docs/*.md runs in the suite as written, or is
a verbatim part of an example the suite runs. A block's first line says which:

* ``# examples/NAME.py``: a verbatim part of that example (tests/test_examples.py runs
  the example and checks the block against it), from the line in the example that
  carries the same tag on; ``# examples/NAME.py (PART)`` names one of several parts;
* anything else runs. A doc's blocks run in order in one namespace, so a block may use
  what the blocks above it defined (as a reader who runs them in turn would). Before the
  first block a doc gets only what ``PREAMBLES`` names, each doc saying so where its
  examples start: ``spark`` (the suite's SparkSession, tests/conftest.py) and ``work``
  (an empty folder, a ``pathlib.Path``) for the docs whose examples use Spark, nothing
  for the others. Queries a doc's blocks leave running are stopped after its last
  block (a reader's process would end there).

A new block without a first-line tag therefore has to run, and an example that stops
working fails here."""

from __future__ import annotations

import ast
import gc
import importlib
import re
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)

#: what a doc's blocks get before its first one (named in the doc where they start)
PREAMBLES: dict[str, tuple[str, ...]] = {"spark.md": ("spark", "work"),
                                         "operating.md": ("spark", "work")}


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    code: str

    @property
    def tag(self) -> str:
        return self.code.splitlines()[0].strip() if self.code.strip() else ""

    @property
    def example(self) -> str | None:
        return self.tag[2:].split()[0] if self.tag.startswith("# examples/") else None

    @property
    def runs(self) -> bool:
        return self.example is None


def blocks(doc: Path) -> list[Block]:
    text = doc.read_text()
    return [Block(doc.name, text.count("\n", 0, m.start()) + 1, textwrap.dedent(m.group(2)))
            for m in BLOCK.finditer(text)]


def all_blocks() -> list[Block]:
    return [b for doc in DOCS for b in blocks(doc)]


def test_every_block_parses_and_imports_what_exists() -> None:
    """Each is Python, and every name it imports from lowtide exists (the example parts
    too), so a renamed API fails here, not in a reader's hands."""
    found = all_blocks()
    assert len(found) >= 40
    for b in found:
        tree = ast.parse(b.code, filename=f"{b.doc}:{b.line}")  # a SyntaxError names it
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lowtide"):
                module = importlib.import_module(node.module or "")
                missing = [a.name for a in node.names if not hasattr(module, a.name)]
                assert not missing, f"{b.doc}:{b.line}: {node.module} has no {missing}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("lowtide"):
                        importlib.import_module(a.name)


def test_example_blocks_are_verbatim_parts_of_the_examples() -> None:
    """Every example is shown in the docs, and a block naming one is a run of its lines
    (indentation aside), from the tag line on."""
    shown = [b for b in all_blocks() if b.example is not None]
    assert {b.example for b in shown} == {f"examples/{p.name}" for p in EXAMPLES}
    for b in shown:
        lines = [line.strip() for line in b.code.splitlines()]
        code = [line.strip() for line in (ROOT / str(b.example)).read_text().splitlines()]
        at = code.index(lines[0])
        assert code[at:at + len(lines)] == lines, f"{b.doc}:{b.line} differs from {b.example}"


def run_doc(doc: str, given: dict[str, Any]) -> dict[str, Any]:
    """Run a doc's blocks in order in one namespace; a failure names the block."""
    namespace: dict[str, Any] = {"__name__": f"docs_{doc.replace('.', '_')}", **given}
    for b in blocks(ROOT / doc if doc == "README.md" else ROOT / "docs" / doc):
        if not b.runs:
            continue
        started = time.monotonic()
        try:
            exec(compile(b.code, f"{doc}:{b.line}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"{doc}, the block at line {b.line}: "
                                 f"{type(e).__name__}: {e}") from e
        print(f"{doc}:{b.line} ran in {time.monotonic() - started:.1f} s")
    return namespace


@pytest.mark.parametrize("doc", [d.name for d in DOCS if d.name not in PREAMBLES
                                 and any(b.runs for b in blocks(d))])
def test_docs_without_spark_run_as_written(doc: str) -> None:
    run_doc(doc, {})


@pytest.fixture
def failures(spark: Any) -> Iterator[list[str]]:
    """What the doc's queries failed with, also in the background, after it stopped the
    queries and closed the pipelines its blocks left (a reader's process would end
    there): a query an example starts must not fail unseen."""
    from pyspark.sql.streaming import StreamingQueryListener

    class Failures(StreamingQueryListener):
        def __init__(self) -> None:
            self.seen: list[str] = []

        def onQueryStarted(self, event: Any) -> None: ...
        def onQueryProgress(self, event: Any) -> None: ...
        def onQueryIdle(self, event: Any) -> None: ...

        def onQueryTerminated(self, event: Any) -> None:
            if event.exception:
                self.seen.append(f"query {event.id}: {event.exception.splitlines()[0]}")

    listener = Failures()
    spark.streams.addListener(listener)
    try:
        yield listener.seen
    finally:
        from lowtide.spark.pipeline.builder import Pipeline

        for query in spark.streams.active:
            query.stop()
        for pipe in [o for o in gc.get_objects() if isinstance(o, Pipeline)]:
            pipe.close()
        spark.streams.removeListener(listener)


@pytest.mark.spark
# operating.md: ~3 min (replay, cuts, graph changes, a standby); its blocks parse and
# import by default (the first test), and each feature's own tests run
@pytest.mark.parametrize("doc", [pytest.param(d, marks=pytest.mark.slow) if d == "operating.md"
                                 else d for d in sorted(PREAMBLES)])
def test_docs_with_spark_run_as_written(doc: str, spark: Any, tmp_path: Path,
                                        failures: list[str]) -> None:
    run_doc(doc, {"spark": spark, "work": tmp_path})
    time.sleep(1.0)   # the listener bus delivers terminations after the fact
    assert not failures, failures
