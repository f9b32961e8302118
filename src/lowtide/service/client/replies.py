"""What a call to the tracker waits for and how long: a reply read as its caller
needs it (a refusal raised, a keyed batch's "applied now", a min time), and a call's
deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

from lowtide.service.client.connection import Reply
from lowtide.service.errors import exception_of
from lowtide.wire.messages import Error, MinTimeAtReply, Ok

T = TypeVar("T")
_timeout = getattr(asyncio, "timeout", None)  # Python 3.11


async def timed(coro: Awaitable[T], timeout_s: float) -> T:
    try:
        if _timeout is None:
            return await asyncio.wait_for(coro, timeout_s)
        # a deadline on this task: wait_for runs the call as one more task (two more
        # turns of the loop per call; a Spark task makes one per batch)
        async with _timeout(timeout_s):
            return await coro
    except TimeoutError:
        raise no_answer(timeout_s) from None


def no_answer(timeout_s: float) -> TimeoutError:
    return TimeoutError(f"no answer from the tracker within {timeout_s} s")


def checked(reply: Reply) -> Reply:
    """``reply``, unless it is a refusal: then its exception is raised."""
    if isinstance(reply, Error):
        raise exception_of(reply)
    return reply


def time_of(reply: Reply) -> int:
    """The min time a MinTimeAt's reply gives; raises a refusal."""
    answer = checked(reply)
    assert isinstance(answer, MinTimeAtReply)
    return answer.time


def applied(replies: Iterable[Reply]) -> bool:
    """Whether a keyed batch's replies say it was applied now (False: before, and this
    is a retry); raises the first refusal."""
    answers = [checked(r) for r in replies]
    return any(isinstance(r, Ok) and not r.duplicate for r in answers)
