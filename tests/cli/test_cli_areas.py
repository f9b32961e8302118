"""The CLI without an area's optional dependencies: a hint, not a traceback."""

from __future__ import annotations

import sys

import pytest

from lowtide import cli


def test_an_area_missing_its_dependency_is_named_with_its_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [m for m in sys.modules if m.startswith(("lowtide.service", "lowtide.spark"))]:
        monkeypatch.delitem(sys.modules, name)
    for name in ["rich", *[m for m in sys.modules if m.startswith("rich.")]]:
        monkeypatch.setitem(sys.modules, name, None)  # import rich... -> ModuleNotFoundError
    parser = cli.build_parser()
    assert parser.epilog is not None
    assert "lowtide[service]" in parser.epilog and "'rich'" in parser.epilog
    assert cli.main(["bench", "core", "--batches", "20"]) == 0  # the core still runs
