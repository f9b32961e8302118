"""Errors between client and server: core protocol errors travel as codes and are
raised again on the client side as the same core exception classes."""

from __future__ import annotations

from typing import TypeVar

from lowtide.core.errors import (
    AckBehindHead,
    FrontBehind,
    FrontHeld,
    FrontOwned,
    LowtideError,
    NonMonotonicHeartbeat,
    ProtocolError,
    TableOverflow,
    UnknownFront,
    UnknownSegment,
)
from lowtide.wire.buffers import WireError
from lowtide.wire.messages import Error, ErrorCode

E = TypeVar("E", bound=BaseException)

# Most specific first: the first match wins.
_CORE: tuple[tuple[type[ProtocolError], ErrorCode], ...] = (
    (UnknownSegment, ErrorCode.UNKNOWN_SEGMENT),
    (UnknownFront, ErrorCode.UNKNOWN_FRONT),
    (FrontHeld, ErrorCode.FRONT_HELD),
    (FrontOwned, ErrorCode.FRONT_OWNED),
    (FrontBehind, ErrorCode.FRONT_BEHIND),
    (NonMonotonicHeartbeat, ErrorCode.NON_MONOTONIC_HEARTBEAT),
    (AckBehindHead, ErrorCode.ACK_BEHIND_HEAD),
    (TableOverflow, ErrorCode.TABLE_OVERFLOW),
    (ProtocolError, ErrorCode.PROTOCOL),
)


class ServiceError(LowtideError, RuntimeError):
    """The server refused a request for a reason that is not a core protocol error
    (bad frame, authentication, graph mismatch, limits)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.reason = message


class Unproven(ServiceError):
    """A shard refuses a flush whose node time it cannot verify (rule 8); its items
    may be in flight anyway, so its min times stay below ``hold`` from now on."""

    def __init__(self, message: str, hold: int) -> None:
        super().__init__(ErrorCode.BAD_REQUEST, message)
        self.hold = hold


class SessionFailed(ServiceError):
    """An agent whose background flush the tracker refused: the acks it carried are
    unknown to the tracker, so the agent refuses every later call (and the tracker
    every later request of its session)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.SESSION_FAILED, message)


class ConnectionLost(LowtideError, ConnectionError):
    """The channel to a peer closed; the agent reconnects and resends."""


def fresh(exc: E) -> E:
    """A copy of ``exc`` with no traceback, to raise again: raising the one object
    kept for later calls adds each raise's frames to its traceback, without bound."""
    new = type(exc).__new__(type(exc))  # BaseException.__new__: __init__ is not rerun
    new.args = exc.args
    new.__dict__.update(exc.__dict__)
    return new


def error_of(req: int, exc: Exception) -> Error:
    """The wire error for an exception raised while handling request ``req``."""
    if isinstance(exc, ProtocolError):
        code = next(c for cls, c in _CORE if isinstance(exc, cls))
        return Error(req, code, str(exc))
    if isinstance(exc, WireError):
        return Error(req, ErrorCode.BAD_FRAME, str(exc))
    if isinstance(exc, ServiceError):
        return Error(req, exc.code, exc.reason)
    return Error(req, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")


def exception_of(err: Error) -> Exception:
    """What a client raises for ``err``: the core class for protocol errors."""
    for cls, code in _CORE:
        if code == err.code:
            return cls(f"tracker refused: {err.message}")
    return ServiceError(err.code, err.message)
