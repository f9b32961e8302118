"""A tracker that may confirm nothing more: after a step raised (its state may be half
applied or its log unwritten, rule 6), or once it stopped leading its group (rule 18).
After a failed step every request is answered with the reason and every connection
closed, so that clients learn at once instead of timing out. After a lost lead nothing
is answered (the requests were not refused: the leader will take them) and every
connection is closed, so that clients resend them to the group's next address."""

from __future__ import annotations

import logging
from collections.abc import Callable

from lowtide.service.errors import ConnectionLost, ServiceError
from lowtide.service.server.inbox import Admit, Item, Outbox, Request
from lowtide.service.server.metrics import ServerMetrics
from lowtide.wire.messages import Error, ErrorCode

log = logging.getLogger("lowtide.service.server")


class FailStop:
    def __init__(self, metrics: ServerMetrics, close_all: Callable[[], None],
                 send: Callable[[Outbox], None]) -> None:
        self._metrics = metrics
        self._close_all = close_all
        self._send = send
        self.error: Error | None = None  # set once stopped: the answer to everything
        self._answers = True  # False after a lost lead: nothing is answered

    def failed(self, exc: Exception, items: list[Item]) -> None:
        log.critical("tracker state step failed: refusing everything from now on",
                     exc_info=exc, extra={"error": repr(exc), "fix": "restart the tracker (it "
                                          "recovers from its state dir)"})
        self._metrics.error(ErrorCode.INTERNAL.name)
        self._stop(f"the tracker failed: {exc!r}", items)

    def lost_lead(self, exc: Exception, items: list[Item], group: str) -> None:
        """Another tracker leads now, or the step log is gone: one line, no traceback."""
        log.error("stopped leading", extra={
            "reason": str(exc), "log": group,
            "fix": "nothing to do: the group's leader serves; restart this one to stand by"})
        self._answers = False
        self._stop(f"this tracker stopped leading: {exc}", items)

    def _stop(self, message: str, items: list[Item]) -> None:
        self.error = Error(0, ErrorCode.INTERNAL, message)
        self.refuse(items)
        self._close_all()

    def refuse(self, items: list[Item]) -> None:
        """The answer to everything once stopped. (A request of the failing step that
        was answered already gets this too; the client drops the stray answer.)"""
        failed = self.error
        assert failed is not None
        out: Outbox = []
        for item in items:
            if isinstance(item, Admit) and not item.reply.done():
                item.reply.set_exception(ServiceError(failed.code, failed.message)
                                         if self._answers else ConnectionLost(failed.message))
            elif isinstance(item, Request) and self._answers:
                req = getattr(item.msg, "req", None)
                if isinstance(req, int):
                    out.append((item.peer, Error(req, failed.code, failed.message)))
        self._send(out)
