"""Deterministic ack values (rule 5): determinism, no zero values, distinctness."""

from __future__ import annotations

import numpy as np

from lowtide.core.acks import child_acks, root_acks, splitmix64

MASK = (1 << 64) - 1
GOLDEN, M1, M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def u64(*values: int) -> np.ndarray:
    return np.array(values, np.uint64)


def _unshift(y: int, shift: int) -> int:
    z = y
    for _ in range(64 // shift + 1):
        z = y ^ (z >> shift)
    return z


def splitmix64_inverse(y: int) -> int:
    """x with splitmix64(x) == y (the finaliser is a bijection of 64-bit words)."""
    z = _unshift(y, 31)
    z = (z * pow(M2, -1, 1 << 64)) & MASK
    z = _unshift(z, 27)
    z = (z * pow(M1, -1, 1 << 64)) & MASK
    z = _unshift(z, 30)
    return (z - GOLDEN) & MASK


def test_splitmix64_matches_the_reference_sequence() -> None:
    # splitmix64 seeded with 0 yields 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, ...
    assert splitmix64(u64(0, GOLDEN)).tolist() == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]


def test_inverse_helper_is_an_inverse() -> None:
    xs = [0, 1, 12345, MASK, 0xDEADBEEF << 20]
    for x in xs:
        assert splitmix64_inverse(int(splitmix64(u64(x))[0])) == x


def test_root_acks_are_deterministic() -> None:
    seq = np.arange(1_000, dtype=np.uint64)
    a = root_acks(3, seq)
    assert a.dtype == np.uint64 and a.shape == (1_000,)
    assert np.array_equal(a, root_acks(3, seq.copy()))
    assert np.array_equal(a[500:], root_acks(3, seq[500:]))  # row-wise: no dependence on batch
    assert np.array_equal(root_acks(3, seq.astype(np.int64)), a)  # any integer column
    assert not np.array_equal(a, root_acks(4, seq))


def test_child_acks_are_deterministic_and_depend_on_every_input() -> None:
    parents = root_acks(1, np.arange(100, dtype=np.uint64))
    idx = np.zeros(100, np.uint64)
    c = child_acks(parents, operator=7, child_index=idx)
    assert np.array_equal(c, child_acks(parents.copy(), operator=7, child_index=idx.copy()))
    assert not np.any(c == parents)
    assert not np.any(c == child_acks(parents, operator=8, child_index=idx))
    assert not np.any(c == child_acks(parents, operator=7, child_index=idx + np.uint64(1)))
    assert not np.any(c == child_acks(parents[::-1], operator=7, child_index=idx))


def test_no_zero_values_even_where_the_hash_is_zero() -> None:
    front = 5
    salt = int(splitmix64(u64(front))[0])
    zero_seq = splitmix64_inverse(0) ^ salt  # splitmix64(seq ^ salt) == 0
    out = root_acks(front, u64(zero_seq, zero_seq ^ 1))
    assert out[0] == 1 and out[1] != 0
    parent = u64(0x1234)
    op_salt = int(splitmix64(u64(9))[0])
    mixed = int(splitmix64(u64(0x1234 ^ op_salt))[0])
    zero_index = (splitmix64_inverse(0) - mixed) & MASK  # splitmix64(mixed + i) == 0
    assert child_acks(parent, operator=9, child_index=u64(zero_index))[0] == 1


def test_values_are_distinct_on_a_large_sample() -> None:
    n = 200_000
    seq = np.arange(n, dtype=np.uint64)
    roots = np.concatenate([root_acks(f, seq) for f in range(4)])
    children = np.concatenate(
        [
            child_acks(roots[:n], operator=op, child_index=np.full(n, i, np.uint64))
            for op in (1, 2)
            for i in range(3)
        ]
    )
    everything = np.concatenate([roots, children])
    ordered = np.sort(everything)
    assert len(everything) == 10 * n
    assert not np.any(ordered[1:] == ordered[:-1])  # all distinct
    assert not np.any(everything == 0)
    # the bits look uniform: every bit is set in about half of the values
    sample = everything[::20]
    bits = (sample[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    share = bits.mean(axis=0)
    assert np.all(np.abs(share - 0.5) < 0.01)
