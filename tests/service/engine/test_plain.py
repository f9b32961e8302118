"""The engines are plain objects (engine/__init__.py says so): no asyncio, sockets,
threads or clock reads, and nothing of the service's network, server or client side.
The server's state task gives them requests and the time; its connections stay out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import lowtide.service.engine

ENGINE = Path(lowtide.service.engine.__file__).parent
#: the service's rooms and modules an engine may not import: they hold connections
ASIDE = ("lowtide.service.net", "lowtide.service.channel", "lowtide.service.handshake",
         "lowtide.service.server", "lowtide.service.client", "lowtide.service.deploy",
         "lowtide.service.persistence", "lowtide.service.web", "lowtide.service.clock")
FORBIDDEN = ("asyncio", "socket", "selectors", "threading", "concurrent", "time", "datetime",
             "subprocess", "http", "urllib", *ASIDE)


def imported(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def forbidden(source: str) -> list[str]:
    return [f"line {line}: {name}" for line, name in imported(ast.parse(source))
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)]


@pytest.mark.parametrize("path", sorted(ENGINE.glob("*.py")), ids=lambda p: p.name)
def test_an_engine_is_plain(path: Path) -> None:
    assert forbidden(path.read_text()) == []


def test_the_check_sees_a_connection() -> None:
    source = ("import asyncio\nfrom lowtide.service.client.connection import ServerConnection\n"
              "from lowtide.service import net\nfrom lowtide.service.errors import ServiceError\n")
    assert forbidden(source) == ["line 1: asyncio",
                                 "line 2: lowtide.service.client.connection.ServerConnection",
                                 "line 3: lowtide.service.net"]
