"""The byte format: messages, frames, log records and snapshots. Pure: no sockets."""

from lowtide.wire.codec import WireError, decode, encode, expect
from lowtide.wire.frames import PREAMBLE, FrameDecoder, FrameTooLarge, frame
from lowtide.wire.messages import WIRE_VERSION, graph_spec

__all__ = [
    "PREAMBLE",
    "WIRE_VERSION",
    "FrameDecoder",
    "FrameTooLarge",
    "WireError",
    "decode",
    "encode",
    "expect",
    "frame",
    "graph_spec",
]
