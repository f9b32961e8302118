"""Who owns a front. A front belongs to the producer that registered it: ``owner`` names it
(default: derived from the log directory, or from the host and the program), and only
a process that names the same owner (with the same secret) may register, heartbeat or
unregister the front: a restarted producer is its own successor, while a second
producer configured with the same front id is refused (``FrontOwned``).
"""

from __future__ import annotations

import os
import socket
import sys
import time as _time

from lowtide.core.errors import FrontHeld
from lowtide.spark.tracking.transport import AgentLike

#: how long a successor retries while its predecessor still holds the front: the
#: tracker's lease (1 s by default) must lapse; a second live producer is refused then
HELD_WAIT_S = 5.0


def register_when_free(agent: AgentLike, front: int, segment: str, time: int, owner: str,
                       wait_s: float = HELD_WAIT_S) -> None:
    """``agent.register_front``, retried while another session of ``owner`` holds the
    front (``FrontHeld``): a restarted producer waits for its predecessor's lease to
    lapse; a second producer that is live all along is refused after ``wait_s``."""
    deadline = _time.monotonic() + wait_s
    while True:
        try:
            agent.register_front(front, segment, time, owner=owner)
            return
        except FrontHeld:
            if _time.monotonic() > deadline:
                raise
            _time.sleep(0.1)


def default_owner(log_dir: str | os.PathLike[str] | None) -> str:
    """The owner name of a front that was given none: its log directory (the log is
    the producer's identity: whoever continues it is the successor), else the host
    and the program. A successor that runs elsewhere (another host, a container with
    a new host name) must be given the same ``owner=`` explicitly."""
    if log_dir is not None:
        return f"lowtide-front:log:{os.path.realpath(log_dir)}"
    program = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return f"lowtide-front:{socket.gethostname()}:{program}"
