"""Which unfinished handshake makes room (the admission gate, no sockets): the oldest
of the address, but one whose Hello arrived whole only after every one without."""

from __future__ import annotations

import asyncio

from lowtide.service.net import Limits
from lowtide.service.server.admission import Gate, Ticket


def arrivals(gate: Gate, hosts: list[str]) -> list[Ticket]:
    async def arrive() -> list[Ticket]:
        return [gate.arrive(host, None) for host in hosts]

    return asyncio.run(arrive())


def test_the_oldest_handshake_of_the_address_makes_room() -> None:
    gate = Gate(Limits(max_handshakes=64, max_handshakes_per_host=3))
    _, b, c, other, d = arrivals(gate, ["h", "h", "h", "x", "h"])
    assert list(gate.handshakes) == [b, c, other, d]
    assert gate.dropped == 1 and gate.per_host == {"h": 3, "x": 1}


def test_a_greeted_handshake_outlives_any_number_of_trickling_ones() -> None:
    """A client whose Hello arrived is answering the challenge; peers of its own address
    that only trickle bytes, renewed as fast as they are dropped, never push it out."""
    gate = Gate(Limits(max_handshakes=64, max_handshakes_per_host=3))
    (good,) = arrivals(gate, ["h"])
    gate.greeted(good)
    arrivals(gate, ["h"] * 40)
    assert good in gate.handshakes and gate.dropped == 38
    gate.admit(good)
    assert gate.admitted == 1 and gate.per_host == {"h": 2}


def test_when_all_are_greeted_the_oldest_goes() -> None:
    gate = Gate(Limits(max_handshakes=2, max_handshakes_per_host=8))
    first, second = arrivals(gate, ["h", "x"])
    gate.greeted(first)
    gate.greeted(second)
    (third,) = arrivals(gate, ["y"])
    assert list(gate.handshakes) == [second, third]
