"""The examples under ``examples/`` run (each checks its own output against a batch
recomputation; one that reads Kafka gets the test session's broker and a new topic
with two partitions), and each docs block that names an example (its first line is
``# examples/NAME.py``) is a verbatim part of that example, so the docs show code that
runs in the suite."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples.{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def python_blocks() -> list[tuple[str, str]]:
    """(doc, block) of every ```python block in README and docs."""
    return [(doc.name, block) for doc in DOCS
            for block in re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)]


def docs_blocks() -> list[tuple[str, str, str]]:
    """(doc, example file, block) of every ```python block naming an example."""
    found = []
    for doc, block in python_blocks():
        first = block.splitlines()[0].strip()
        if first.startswith("# examples/"):
            found.append((doc, first[2:], block))
    return found


def test_every_docs_block_parses_and_imports_what_exists() -> None:
    """Blocks that are not a part of an example are fragments (they use a ``pipe``, a
    ``spark``, a ``df`` of the text around them): each must be Python, and every name it
    imports from lowtide must exist, so a renamed API fails here, not in a reader's
    hands."""
    blocks = python_blocks()
    assert len(blocks) >= 30
    for doc, block in blocks:
        tree = ast.parse(textwrap.dedent(block), filename=doc)  # a SyntaxError names it
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lowtide"):
                module = importlib.import_module(node.module or "")
                missing = [a.name for a in node.names if not hasattr(module, a.name)]
                assert not missing, f"{doc}: {node.module} has no {missing}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("lowtide"):
                        importlib.import_module(a.name)


def test_readme_quick_start_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's block is a whole program (the core alone): it runs and prints the
    min times it announces."""
    [(_doc, block)] = [(d, b) for d, b in python_blocks() if d == "README.md"]
    exec(compile(block, "README.md", "exec"), {})
    assert "MinTimeUpdate(segment='src', time=12)" in capsys.readouterr().out


def test_docs_show_the_examples_verbatim() -> None:
    blocks = docs_blocks()
    assert {name for _, name, _ in blocks} == {f"examples/{p.name}" for p in EXAMPLES}
    for doc, name, block in blocks:
        source = textwrap.dedent((ROOT / name).read_text())
        lines = [line.strip() for line in textwrap.dedent(block).splitlines()]
        code = [line.strip() for line in source.splitlines()]
        at = code.index(lines[0])
        assert code[at:at + len(lines)] == lines, f"{doc}'s block differs from {name}"


@pytest.mark.spark
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_and_equals_its_batch_recomputation(spark, tmp_path: Path, path: Path,
                                                         request: pytest.FixtureRequest
                                                         ) -> None:
    module = load(path)
    if "bootstrapServers" in inspect.signature(module.main).parameters:
        broker = request.getfixturevalue("kafka_broker")
        module.main(spark, tmp_path, broker.bootstrap, request.getfixturevalue("kafka_topic")(2))
    else:
        module.main(spark, tmp_path)
