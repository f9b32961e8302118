"""The core is sans-I/O: no asyncio, sockets, threads, pyspark, subprocesses or clock reads."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import lowtide.core

CORE = Path(lowtide.core.__file__).parent
SOURCES = sorted(CORE.glob("*.py"))

FORBIDDEN_MODULES = {
    "asyncio",
    "socket",
    "socketserver",
    "ssl",
    "selectors",
    "select",
    "threading",
    "_thread",
    "multiprocessing",
    "concurrent",
    "subprocess",
    "pyspark",
    "time",  # the stdlib clock; lowtide.core.time is fine
    "datetime",
    "zmq",
    "http",
    "urllib",
    "requests",
}
CLOCK_CALLS = {
    ("time", "time"),
    ("time", "time_ns"),
    ("time", "monotonic"),
    ("time", "monotonic_ns"),
    ("time", "perf_counter"),
    ("time", "perf_counter_ns"),
    ("time", "process_time"),
    ("time", "sleep"),
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("datetime", "today"),
    ("date", "today"),
}
CLOCK_NAMES = {"monotonic", "perf_counter", "time_ns", "monotonic_ns", "utcnow"}


def violations(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.split(".")[0] in FORBIDDEN_MODULES:
                found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                owner = func.value
                name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
                if (name, func.attr) in CLOCK_CALLS:
                    found.append(f"line {node.lineno}: {name}.{func.attr}()")
            elif isinstance(func, ast.Name) and func.id in CLOCK_NAMES:
                found.append(f"line {node.lineno}: {func.id}()")
        elif isinstance(node, ast.Name) and node.id == "__import__":
            found.append(f"line {node.lineno}: __import__")
    return found


def test_the_scan_sees_every_core_module() -> None:
    names = {p.stem for p in SOURCES}
    assert {"time", "messages", "graph", "tracker", "local", "sharding", "acks"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_core_module_is_free_of_io_threads_and_clocks(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    assert violations(tree) == [], f"{path.name} breaks the sans-I/O rule"


def test_the_scanner_catches_what_it_should() -> None:
    bad = """
import asyncio, os
import socket as s
from threading import Lock
from time import monotonic
import datetime
from concurrent.futures import ThreadPoolExecutor
import time
t = time.time()
d = datetime.datetime.now()
m = monotonic()
"""
    found = violations(ast.parse(bad))
    assert len(found) == 10, found
    ok = """
from lowtide.core.time import TimeGrid
from .time import TIME_LIMIT
import hashlib, numpy as np
grid.window_of(3)
"""
    assert violations(ast.parse(ok)) == []
