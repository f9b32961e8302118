"""The tree keeps the architecture (docs/ARCHITECTURE.md): imports point one way,
core <- wire <- service <- spark <- apps <- bench <- cli, and what sits above the
product (apps, bench) uses only the product's public API: names a package lists in
its ``__all__``, or the core's modules (the core is a library of its own). Within a
layer, no two modules import each other at run time, not even through a third."""

from __future__ import annotations

import ast
import graphlib
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import lowtide

ROOT = Path(lowtide.__file__).parent
LAYERS = ("core", "wire", "service", "spark", "apps", "bench", "cli")
PRODUCT = ("core", "wire", "service", "spark")
RANK = {name: i for i, name in enumerate(LAYERS)}


def imports(source: str) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    """(line, lowtide module, names) for every absolute import of lowtide, lazy ones too."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "lowtide":
                yield node.lineno, node.module, tuple(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "lowtide":
                    yield node.lineno, alias.name, ()


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANK else None


def sources(*layers: str) -> list[Path]:
    return sorted(p for layer in layers for p in (ROOT / layer).rglob("*.py"))


def own_layer(path: Path) -> str:
    return path.relative_to(ROOT).parts[0]


def upward_imports(source: str, own: str) -> list[str]:
    bad = []
    for line, module, _ in imports(source):
        target = layer_of(module)
        if target is None and module != "lowtide":
            bad.append(f"line {line}: {module} is in no layer")
        elif target is not None and RANK[target] > RANK[own]:
            bad.append(f"line {line}: {own} imports {module} ({target} is above it)")
    return bad


def private_imports(source: str) -> list[str]:
    """Imports from the product that are not its public API."""
    bad = []
    for line, module, names in imports(source):
        target = layer_of(module)
        if target not in PRODUCT or target == "core":
            continue
        mod = importlib.import_module(module)
        if not mod.__file__ or not mod.__file__.endswith("__init__.py"):
            bad.append(f"line {line}: {module} is a module, not a package's API")
            continue
        public = set(getattr(mod, "__all__", ()))
        bad += [f"line {line}: {module}.{n} is not in its __all__" for n in names
                if n not in public]
    return bad


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import that runs, at module level or inside a function (a lazy import
    closes a cycle all the same), but not those under ``if TYPE_CHECKING:``."""
    if isinstance(tree, ast.If) and "TYPE_CHECKING" in ast.unparse(tree.test):
        for node in tree.orelse:
            yield from runtime_imports(node)
        return
    if isinstance(tree, (ast.Import, ast.ImportFrom)):
        yield tree
    for node in ast.iter_child_nodes(tree):
        yield from runtime_imports(node)


def import_graph(modules: dict[str, str]) -> dict[str, set[str]]:
    """module -> the modules of ``modules`` (name -> source) it imports at run time;
    ``from pkg import mod`` points at ``pkg.mod``, ``from mod import name`` at ``mod``."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, source in modules.items():
        for node in runtime_imports(ast.parse(source)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif node.level == 0 and node.module:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                           else node.module for a in node.names]
            else:
                targets = []
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` (its modules in order, the first again last), or []."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        return list(err.args[1])
    return []


def test_every_layer_is_a_package_of_the_tree() -> None:
    assert {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()} == set(LAYERS)


@pytest.mark.parametrize("path", sources(*LAYERS), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path: Path) -> None:
    assert upward_imports(path.read_text(), own_layer(path)) == []


@pytest.mark.parametrize("path", sources("apps", "bench"), ids=lambda p: str(p.relative_to(ROOT)))
def test_apps_and_benches_use_the_public_api(path: Path) -> None:
    assert private_imports(path.read_text()) == []


@pytest.mark.parametrize("package", ["lowtide", "lowtide.spark", "lowtide.service",
                                     "lowtide.wire", "lowtide.spark.sources",
                                     "lowtide.spark.operators", "lowtide.spark.sinks",
                                     "lowtide.spark.pipeline", "lowtide.spark.tracking"])
def test_public_packages_say_what_they_export(package: str) -> None:
    mod = importlib.import_module(package)
    assert mod.__doc__ and mod.__all__
    for name in mod.__all__:
        assert getattr(mod, name) is not None, f"{package}.{name}"


def test_the_checks_catch_what_they_should() -> None:
    up = "from lowtide.spark.pipeline import Pipeline\nimport lowtide.bench.core\n"
    assert len(upward_imports(up, "service")) == 2
    assert upward_imports(up, "cli") == []
    private = ("from lowtide.service.client.agent import Agent\n"
               "from lowtide.spark import _REGISTERED\n"
               "from lowtide.core.acks import root_acks\n"
               "from lowtide.service import Agent\n")
    assert len(private_imports(private)) == 2


def test_no_runtime_import_cycle() -> None:
    graph = import_graph({module_name(p): p.read_text() for p in ROOT.rglob("*.py")})
    assert import_cycle(graph) == []


def test_the_cycle_check_sees_lazy_imports_and_skips_type_checking() -> None:
    modules = {
        "lowtide.apps.a": "from lowtide.apps import b\n",
        "lowtide.apps.b": "def f():\n    from lowtide.apps.a import x\n",
        "lowtide.apps.c": "if TYPE_CHECKING:\n    from lowtide.apps.a import y\n",
        "lowtide.apps": "",
    }
    graph = import_graph(modules)
    assert graph["lowtide.apps.c"] == set()
    assert set(import_cycle(graph)) == {"lowtide.apps.a", "lowtide.apps.b"}
    graph["lowtide.apps.b"].clear()
    assert import_cycle(graph) == []


def test_test_modules_share_helpers_not_each_other() -> None:
    """What several test modules use lives in a helper module (tests/<area>/helpers.py
    and the like): a test module imported by another runs its imports twice over and
    has once made a cycle."""
    tests = ROOT.parents[1] / "tests"
    bad = [f"{p.relative_to(tests)}: {module}" for p in sorted(tests.rglob("*.py"))
           for node in ast.walk(ast.parse(p.read_text()))
           if isinstance(node, ast.ImportFrom) and (module := node.module or "")
           and module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_")]
    assert bad == []


def test_the_architecture_map_names_every_module() -> None:
    """docs/ARCHITECTURE.md's tree stays true: every package and module is in it."""
    doc = (ROOT.parents[1] / "docs" / "ARCHITECTURE.md").read_text()
    tree = doc[doc.index("## The tree"):doc.index("Public API")]
    words = set(tree.replace("/", " ").replace(",", " ").replace("(", " ").replace(")", " ")
                .replace(":", " ").replace(";", " ").split())
    missing = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
               if p.stem not in ("__init__", "__main__") and p.stem not in words]
    missing += [str(d.relative_to(ROOT)) for d in ROOT.rglob("*")
                if (d / "__init__.py").exists() and d.name not in words]
    assert missing == []
