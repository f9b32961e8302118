"""Reading what the tracker logs, whatever handlers other tests left on ``lowtide``."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def capturing(formatter: logging.Formatter) -> Iterator[io.StringIO]:
    """Every ``lowtide`` log line, formatted by ``formatter``."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger("lowtide")
    saved = root.handlers[:], root.level, root.propagate
    root.handlers[:], root.propagate = [handler], False
    root.setLevel(logging.INFO)
    try:
        yield out
    finally:
        root.handlers[:], root.propagate = saved[0], saved[2]
        root.setLevel(saved[1])
