"""The byte format: messages, frames, log records and snapshots. Pure: no sockets.

The messages a peer exchanges are public too, for tools that speak the protocol
below the agent (raw clients, fuzzers, test doubles)."""

from lowtide.wire.buffers import WireError
from lowtide.wire.codec import decode, encode, expect
from lowtide.wire.frames import PREAMBLE, FrameDecoder, FrameTooLarge, frame
from lowtide.wire.messages import (
    WIRE_VERSION,
    BatchState,
    GraphSpec,
    Hello,
    Message,
    Notify,
    Ok,
    QueryBatch,
    Role,
    Subscribe,
    Welcome,
    graph_spec,
)

__all__ = [
    "PREAMBLE",
    "WIRE_VERSION",
    "BatchState",
    "FrameDecoder",
    "FrameTooLarge",
    "GraphSpec",
    "Hello",
    "Message",
    "Notify",
    "Ok",
    "QueryBatch",
    "Role",
    "Subscribe",
    "Welcome",
    "WireError",
    "decode",
    "encode",
    "expect",
    "frame",
    "graph_spec",
]
