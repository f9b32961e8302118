r"""Structured logs: one JSON object per line, the ``extra`` fields as keys.

Modules log with ``log.warning("refused peer", extra={"peer": ..., "reason": ...})``;
this formatter keeps those fields machine-readable instead of pasting them into text.
A handler lowtide did not set up (Python's last-resort handler, ``basicConfig``, a
notebook's) prints only the record's message: so the message of every ``lowtide.*``
record carries its fields too (``refused peer: peer=..., reason=...``), and no line
is ever just an event's name. Fields often come from peers (client names, error
text): each is cut to ``MAX_FIELD`` characters and control characters are escaped,
so a peer can neither flood the log nor forge lines in it. :class:`LogBudget`
rate-limits what one peer can make us log.

>>> clip("a\nb" * 100, 8)
'a\nba\nba\n... (300 chars)'
>>> escape("forged\n12:00:00 info ok")
'forged\\n12:00:00 info ok'
>>> budget = LogBudget(burst=2, period_s=60, clock=lambda: 0.0)
>>> [budget.allow("peer") for _ in range(4)]
[0, 0, None, None]
>>> record = logging.getLogger("lowtide.x").makeRecord(
...     "lowtide.x", logging.WARNING, "f", 1, "stuck window", (), None, extra={"where": "a\nb"})
>>> record.getMessage(), event_of(record)
('stuck window: where=a\\nb', 'stuck window')
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Hashable
from typing import Any

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
MAX_FIELD = 256
_CONTROL = {c: f"\\x{c:02x}" for c in range(32)} | {
    ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", 0x7F: "\\x7f"
}


def clip(value: object, limit: int = MAX_FIELD) -> str:
    """``value`` as text of at most ``limit`` characters (plus a note of the length)."""
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def escape(text: str) -> str:
    """Control characters as escapes: one record stays one line."""
    return text.replace("\\", "\\\\").translate(_CONTROL)


def _field(value: object) -> object:
    """Numbers as they are, short containers too (JSON keeps their structure), the
    rest as clipped text."""
    if value is None or isinstance(value, int | float | bool):
        return value
    if isinstance(value, list | tuple | dict) and len(str(value)) <= MAX_FIELD:
        return value
    return clip(value)


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: _field(v) for k, v in record.__dict__.items() if k not in _STANDARD}


class _EventRecord(logging.LogRecord):
    """A ``lowtide.*`` record: its message is the event followed by its fields."""

    def getMessage(self) -> str:
        event = super().getMessage()
        fields = _fields(self)
        if not fields:
            return event
        return f"{event}: " + ", ".join(f"{k}={escape(str(v))}" for k, v in fields.items())


def event_of(record: logging.LogRecord) -> str:
    """The event alone, without the fields a lowtide record's message carries."""
    if isinstance(record, _EventRecord):
        return logging.LogRecord.getMessage(record)
    return record.getMessage()


def _lowtide_records(base: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = base(*args, **kwargs)
        name = record.name or ""  # logging.makeLogRecord sets it only afterwards
        if type(record) is logging.LogRecord and name.split(".", 1)[0] == "lowtide":
            record.__class__ = _EventRecord  # fields are set after this: read when formatted
        return record

    return make


# The documented hook for the records every logger makes; other records are untouched,
# and a factory set before this one still makes them.
logging.setLogRecordFactory(_lowtide_records(logging.getLogRecordFactory()))


class LogBudget:
    """At most ``burst`` lines per key (a peer) in each ``period_s``. :meth:`allow`
    returns None for a line to drop, else how many were dropped since the last one
    (worth logging with it). Forgets every key past ``max_keys`` (a flood of peers)."""

    def __init__(
        self,
        burst: int = 5,
        period_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
    ) -> None:
        self.burst, self.period_s, self._clock, self._max_keys = burst, period_s, clock, max_keys
        self._keys: dict[Hashable, list[float]] = {}  # key -> [window start, lines, dropped]

    def allow(self, key: Hashable) -> int | None:
        now = self._clock()
        entry = self._keys.get(key)
        if entry is None or now - entry[0] >= self.period_s:
            if len(self._keys) >= self._max_keys:
                self._keys.clear()
            dropped = 0 if entry is None else int(entry[2])
            self._keys[key] = [now, 1, 0]
            return dropped
        if entry[1] < self.burst:
            entry[1] += 1
            dropped, entry[2] = int(entry[2]), 0
            return dropped
        entry[2] += 1
        return None

    def forget(self, key: Hashable) -> None:
        self._keys.pop(key, None)

    def warn(
        self, logger: logging.Logger, key: Hashable, event: str, level: int = logging.WARNING,
        **fields: object,
    ) -> None:
        """``logger.log(level, event)`` with ``fields``, if ``key`` has lines left."""
        suppressed = self.allow(key)
        if suppressed is not None:
            logger.log(level, event, extra={**fields, "suppressed": suppressed})


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": clip(event_of(record)),
        }
        body.update(_fields(record))
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


class TextFormatter(logging.Formatter):
    """``event key=value ...`` for humans."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={escape(str(v))}" for k, v in _fields(record).items())
        stamp = self.formatTime(record, "%H:%M:%S")
        event = escape(clip(event_of(record)))
        line = f"{stamp} {record.levelname.lower():7} {record.name}: {event} {extras}"
        if record.exc_info:  # our own traceback, several lines on purpose
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(fmt: str = "json", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("lowtide")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
