"""Which requests were applied already: at most once per (session, req) and per key.

A session is one agent's life; its requests carry growing numbers, so one high-water
mark per session catches any resend after a reconnect. Keys (rule 6) come from Spark
tasks that may run anywhere, again and again: each key is remembered for
``retention_ms`` (and at most ``max_keys`` of them), long enough to cover task retries
and query restarts. A retry older than that meets the core's AckBehindHead check
instead, as its windows are long complete.

Refusals are remembered too (the last 64 per session, in snapshots as well): a resent
request that was refused gets its error again, and one whose outcome was forgotten
gets an error saying so, never a duplicate's Ok (refused means never applied). A
*failed* session (its background flush was refused) is refused from then on and
never expires.

>>> d = Dedup(retention_ms=1_000, max_keys=10)
>>> d.seen(1, 1, "k"), d.record(1, 1, "k", now_ms=0), d.seen(2, 1, "k"), d.seen(1, 1, "")
(False, None, True, True)
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from lowtide.wire.messages import Error, ErrorCode, Ok

_KEPT_ERRORS = 64


@dataclass
class _Session:
    high: int = 0
    last_ms: int = 0
    errors: OrderedDict[int, Error] = field(default_factory=OrderedDict)
    forgot: int = 0  # the highest request whose error was dropped to keep _KEPT_ERRORS
    failed: str | None = None  # why the session failed, if it did


class Dedup:
    def __init__(self, retention_ms: int, max_keys: int) -> None:
        self.retention_ms = retention_ms
        self.max_keys = max_keys
        self._keys: OrderedDict[str, int] = OrderedDict()
        self._sessions: dict[int, _Session] = {}
        self.hits = 0

    def seen(self, session: int, req: int, key: str) -> bool:
        """True if this request, or another with the same key, was handled before."""
        s = self._sessions.get(session)
        hit = (s is not None and req <= s.high) or (bool(key) and key in self._keys)
        self.hits += hit
        return hit

    def outcome(self, session: int, req: int) -> Ok | Error:
        """The answer to a request :meth:`seen` before: the error it got the first time
        if it was refused, else a duplicate's Ok (a key applied by anyone)."""
        s = self._sessions.get(session)
        if s is None or req > s.high:
            return Ok(req, duplicate=True)
        earlier = s.errors.get(req)
        if earlier is not None:
            return earlier
        if req <= s.forgot:
            return Error(req, ErrorCode.BAD_REQUEST, f"request {req} is too old: its outcome "
                         "is no longer known; send its content again as a new request")
        return Ok(req, duplicate=True)

    def failure(self, session: int) -> str | None:
        s = self._sessions.get(session)
        return None if s is None else s.failed

    def fail(self, session: int, reason: str) -> None:
        self._sessions.setdefault(session, _Session()).failed = reason

    def record(self, session: int, req: int, key: str, now_ms: int) -> None:
        s = self._sessions.setdefault(session, _Session())
        s.high, s.last_ms = max(s.high, req), now_ms
        if key:
            self._keys[key] = now_ms
            self._keys.move_to_end(key)

    def record_error(self, session: int, req: int, error: Error, now_ms: int) -> None:
        self.record(session, req, "", now_ms)
        errors = self._sessions[session].errors
        errors[req] = error
        while len(errors) > _KEPT_ERRORS:
            old, _ = errors.popitem(last=False)
            self._sessions[session].forgot = max(self._sessions[session].forgot, old)

    def expire(self, now_ms: int) -> None:
        horizon = now_ms - self.retention_ms
        keys = self._keys
        while keys and (len(keys) > self.max_keys or next(iter(keys.values())) < horizon):
            keys.popitem(last=False)
        for sid in [
            sid for sid, s in self._sessions.items() if s.last_ms < horizon and not s.failed
        ]:
            del self._sessions[sid]

    def __len__(self) -> int:
        return len(self._keys)

    def export(self) -> dict[str, Any]:
        return {
            "keys": list(self._keys.items()),
            "sessions": [
                (sid, s.high, s.last_ms, _errors(s), s.forgot, s.failed)
                for sid, s in self._sessions.items()
            ],
        }

    def load(self, state: dict[str, Any]) -> None:
        self._keys = OrderedDict((k, int(t)) for k, t in state["keys"])
        self._sessions = {}
        for sid, high, last_ms, errors, forgot, failed in state["sessions"]:
            kept = OrderedDict(
                (int(req), Error(int(req), ErrorCode(code), msg)) for req, code, msg in errors
            )
            self._sessions[int(sid)] = _Session(int(high), int(last_ms), kept, int(forgot), failed)


def _errors(s: _Session) -> list[list[object]]:
    return [[e.req, int(e.code), e.message] for e in s.errors.values()]
