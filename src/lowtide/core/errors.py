"""Errors the core raises for input that breaks the protocol.

Every check runs before any state changes, so a caller (the service) can refuse the
offending message, keep serving everyone else, and trust that the state is unchanged.
"""

from __future__ import annotations


class LowtideError(Exception):
    """The base of every error lowtide raises on purpose (``lowtide.LowtideError``).
    Each subclass also keeps the builtin parent callers already catch (``ValueError``
    for bad input, ``RuntimeError`` for a failed run, ...)."""


class ProtocolError(LowtideError, ValueError):
    """Input that no legal sender produces; the tracker state is unchanged."""


class UnknownSegment(ProtocolError):
    """A segment index or name that the pipeline graph does not declare."""


class UnknownFront(ProtocolError):
    """A heartbeat or unregister for a front that is not registered."""


class NonMonotonicHeartbeat(ProtocolError):
    """A front promised time t and later announced an earlier time."""


class FrontOwned(ProtocolError):
    """A register, heartbeat, unregister or retire of a front by someone other than
    its owner."""


class FrontHeld(FrontOwned):
    """A register or unregister of a front by its owner's other session while the
    session holding it is live (seen within the lease): a second producer."""


class FrontBehind(ProtocolError):
    """A new front that registers below what its segment already announced: it
    started too late, and nobody had declared it (its records would be passed)."""


class AckBehindHead(ProtocolError):
    """An ack for a window the tracker already announced complete."""


class TableOverflow(ProtocolError):
    """An ack so far ahead of the head that the checksum table may not grow to hold it."""


class GenerationOutOfOrder(ProtocolError):
    """A graph change (or a snapshot) that does not follow the tracker's generation."""


class GraphError(LowtideError, ValueError):
    """A pipeline graph that cannot be tracked (cycle, unknown or duplicate names)."""
