"""Who may hold a connection: handshakes apart from admitted peers, and both inside the
process's file limit.

A peer that has not proven itself (no secret yet, or no Hello) holds one of
``max_handshakes`` slots, at most ``max_handshakes_per_host`` of them from one address,
and only for ``handshake_timeout_s`` from the moment it was accepted. When the slots
are full, a new connection does not wait: the oldest unfinished handshake (of its own
address first) is dropped to make room, since a real client finishes its handshake in
milliseconds and the oldest is the likeliest to be stuck or hostile. A handshake whose
Hello arrived whole (it is answering the challenge) goes only after every one that
has not: a real client sends its Hello with its first bytes, so peers that trickle
bytes cannot push it out even from its own address, however fast they renew. So slow
or silent connections from other addresses can never lock a good client out, whatever
their number, and an admitted client never competes with them: admitted peers have
``max_connections`` of their own. (From the client's own address, more than
``max_handshakes_per_host`` new connections accepted before its Hello is read still
push it out; it then dials again after its backoff.)

The file limit: every connection is a file descriptor, and so are the write-ahead
log, snapshots and HTTP requests. :func:`fit_file_limit` lowers ``max_connections``
so that admitted peers, handshakes, HTTP requests and :data:`FD_RESERVE` fit under the
soft ``RLIMIT_NOFILE`` (``ulimit -n``), counted from the descriptors already open:

>>> from lowtide.service.net import Limits
>>> fit_file_limit(Limits(), soft=1024, fds_open=20, http=0).max_connections
812
>>> fit_file_limit(Limits(), soft=65536, fds_open=20, http=128).max_connections
1024
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from lowtide.service.errors import ServiceError
from lowtide.service.logs import LogBudget
from lowtide.wire.messages import ErrorCode

if TYPE_CHECKING:
    from lowtide.service.net import Limits

log = logging.getLogger("lowtide.service.net")

#: Descriptors kept free beyond connections: the log file, a snapshot being written,
#: the state dir's lock and files, stdio, shard pipes, and a burst of accepted sockets
#: (asyncio accepts up to 100 at once before any is looked at).
FD_RESERVE = 128
#: Fewer admitted connections than this and the tracker would be of little use.
MIN_CONNECTIONS = 16


def open_fds() -> int:
    """How many file descriptors this process has open (a guess where /proc is absent)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 32


def fit_file_limit(limits: Limits, soft: int | None = None, fds_open: int | None = None,
                   http: int = 0) -> Limits:
    """``limits`` with ``max_connections`` lowered to fit the file limit (``soft``, read
    from the process if None); ``http``: HTTP connections the process may serve.
    Raises ValueError, saying what to do, when too few connections would be left."""
    if soft is None:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return limits
    used = (open_fds() if fds_open is None else fds_open) + FD_RESERVE + http
    room = soft - used - limits.max_handshakes
    if room < MIN_CONNECTIONS:
        raise ValueError(
            f"the file limit (ulimit -n) is {soft}: with {used} descriptors in use or "
            f"reserved and {limits.max_handshakes} handshakes, room for only {room} "
            f"connections; raise it (ulimit -n 4096) before starting the tracker"
        )
    return replace(limits, max_connections=min(limits.max_connections, room))



@dataclass(eq=False)
class Ticket:
    """One accepted connection: its address, the task serving it, the loop time its
    handshake must end by, and whether it has proven itself (then it is no longer a
    handshake, and may not be dropped); ``greeted`` once its Hello arrived whole."""

    host: str
    task: asyncio.Task[None] | None
    deadline: float
    admitted: bool = False
    greeted: bool = False


@dataclass
class Gate:
    """Counts of one listener's connections; see the module docstring."""

    limits: Limits
    handshakes: dict[Ticket, None] = field(default_factory=dict)  # oldest first
    per_host: Counter[str] = field(default_factory=Counter)
    admitted: int = 0
    dropped: int = 0
    _log: LogBudget = field(default_factory=LogBudget)

    def arrive(self, host: str, task: asyncio.Task[None] | None) -> Ticket:
        """A connection was accepted: make room for its handshake (dropping the oldest
        one of its address, else the oldest of all, when their slots are full)."""
        limits = self.limits
        if self.per_host[host] >= limits.max_handshakes_per_host:
            self._drop(self._oldest(lambda t: t.host == host),
                       f"{host} has {limits.max_handshakes_per_host} unfinished handshakes "
                       "(Limits.max_handshakes_per_host)")
        elif len(self.handshakes) >= limits.max_handshakes:
            self._drop(self._oldest(lambda t: True),
                       f"{limits.max_handshakes} handshakes are unfinished "
                       "(Limits.max_handshakes)")
        deadline = asyncio.get_running_loop().time() + limits.handshake_timeout_s
        ticket = Ticket(host, task, deadline)
        self.handshakes[ticket] = None
        self.per_host[host] += 1
        return ticket

    def _oldest(self, among: Callable[[Ticket], bool]) -> Ticket:
        """The handshake to drop: the oldest of ``among`` without a Hello, else the oldest."""
        candidates = [t for t in self.handshakes if among(t)]
        return next((t for t in candidates if not t.greeted), candidates[0])

    def greeted(self, ticket: Ticket) -> None:
        """The peer's Hello arrived whole: it is dropped only after those without one."""
        ticket.greeted = True

    def admit(self, ticket: Ticket) -> None:
        """The peer proved itself: it now holds one of ``max_connections``, or is
        refused (LIMIT) when they are all taken."""
        if self.admitted >= self.limits.max_connections:
            raise ServiceError(
                ErrorCode.LIMIT,
                f"{self.limits.max_connections} clients are connected, the limit "
                "(Limits.max_connections, lowered to fit ulimit -n): retrying",
            )
        self._forget_handshake(ticket)
        ticket.admitted = True
        self.admitted += 1

    def leave(self, ticket: Ticket) -> None:
        if ticket.admitted:
            self.admitted -= 1
            ticket.admitted = False
        else:
            self._forget_handshake(ticket)

    def _forget_handshake(self, ticket: Ticket) -> None:
        if self.handshakes.pop(ticket, False) is None:
            self.per_host[ticket.host] -= 1
            if not self.per_host[ticket.host]:
                del self.per_host[ticket.host]

    def _drop(self, ticket: Ticket, why: str) -> None:
        self._forget_handshake(ticket)
        self.dropped += 1
        if ticket.task is not None:
            ticket.task.cancel()
        self._log.warn(log, ticket.host, "dropped an unfinished handshake", logging.INFO,
                       peer=ticket.host, reason=f"{why}: the oldest makes room for a new one")
