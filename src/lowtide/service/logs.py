"""Structured logs: one JSON object per line, the ``extra`` fields as keys.

Modules log with ``log.warning("refused peer", extra={"peer": ..., "reason": ...})``;
this formatter keeps those fields machine-readable instead of pasting them into text.
"""

from __future__ import annotations

import json
import logging
import sys

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        body.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


class TextFormatter(logging.Formatter):
    """``event key=value ...`` for humans."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD)
        stamp = self.formatTime(record, "%H:%M:%S")
        return f"{stamp} {record.levelname.lower():7} {record.name}: {record.getMessage()} {extras}"


def setup(fmt: str = "json", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("lowtide")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
