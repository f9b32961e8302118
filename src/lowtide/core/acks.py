"""Deterministic ack values (rule 5), vectorised: one numpy pass, no per-row Python.

An item's ack value is a pure function of its identity, so a retried Spark task acks
exactly what the first attempt acked. Roots: ``root_acks(front, seq)``; children:
``child_acks(parent, operator, child_index)``. splitmix64 mixes the inputs; a value
of 0 would vanish in XOR, so it is mapped to 1.

>>> import numpy as np
>>> a = root_acks(3, np.arange(4, dtype=np.uint64))
>>> bool((a == root_acks(3, np.arange(4, dtype=np.uint64))).all()), len(set(a.tolist()))
(True, 4)
>>> int(child_acks(a[:1], operator=7, child_index=np.zeros(1, np.uint64))[0]) != int(a[0])
True
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: U64) -> U64:
    """The splitmix64 finaliser, elementwise; uint64 arithmetic wraps as intended."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    out: U64 = z ^ (z >> np.uint64(31))
    return out


def _nonzero(x: U64) -> U64:
    return np.where(x == 0, np.uint64(1), x)


def root_acks(front: int, seq: U64) -> U64:
    """Ack values of the items a front labelled with sequence numbers ``seq``."""
    salt = splitmix64(np.array([front], np.uint64))[0]
    return _nonzero(splitmix64(seq.astype(np.uint64) ^ salt))


def child_acks(parent: U64, operator: int, child_index: U64) -> U64:
    """Ack values of children ``child_index`` emitted by ``operator`` from ``parent``."""
    salt = splitmix64(np.array([operator], np.uint64))[0]
    mixed = splitmix64(parent.astype(np.uint64) ^ salt)
    return _nonzero(splitmix64(mixed + child_index.astype(np.uint64)))
