"""A content-binding digest of a tensor's bytes, computed with torch integer ops on its device.

The timed loop commits to each call's outputs by sending their digests to the supervisor before
it learns which calls are audited; the supervisor recomputes the digest of every output it is
shown and compares. The same function runs in the worker (on the output's device) and in the
supervisor (on the CPU): it uses only exact int64 arithmetic on values below 2**63 (no overflow,
no floating point), so the result is the same bits on every device.

Construction, in two independent lanes (different constants), each modulo the prime
``P = 2**31 - 1``:

* the bytes, zero-padded to whole 32-bit words, each word split into its 16-bit halves
  ``lo, hi``; leaf ``= (lo + hi * A + B) mod P``, injective in each half;
* leaves padded to a power of two with a fixed value, then reduced pairwise to one root,
  ``parent = perm((left * M1 + right * M2 + C) mod P)`` with ``perm(x) = x**5 mod P``, a
  permutation of the residues (5 does not divide ``P - 1``); the root is mixed with the byte
  length the same way.

Each step is injective in each of its inputs, so a change confined to one 16-bit half of one word
(a single flipped bit, or any change of one element of 2 bytes or less) always changes both lanes.
Keeping a digest while changing several elements needs some subtree to take a chosen value in
both lanes at once: a search over about ``2**62`` candidates with ``perm`` between levels (no
additive structure to exploit across elements). It is not a cryptographic hash; it binds a
worker to outputs it must have had when it sent the digest.
"""

from __future__ import annotations

import torch

__all__ = ["CHUNK_WORDS", "P", "digest", "digests"]

P = (1 << 31) - 1
#: Per lane: A, B (leaves), M1, M2, C (nodes); A, M1, M2 below 2**30 so sums stay below 2**63.
_CONSTANTS = (
    (40503, 12345, 69069, 1013904223 >> 1, 362436069),
    (65521, 7, 1103515245 >> 1, 48271, 521288629),
)
_PAD_LEAF = 0x5BD1E995 % P
#: Leaves made and reduced at a time (a power of two): an aligned block of the tree reduces to
#: the root of its subtree, so the digest is the same for any block size, and its int64
#: temporaries take a few hundred MiB (2 lanes x 8 bytes x this, a few times) whatever the size.
CHUNK_WORDS = 1 << 24


def _fold(x: torch.Tensor) -> torch.Tensor:
    """A value congruent to ``x`` modulo ``P`` and below ``2**31 + 2``, for ``0 <= x < 2**63``
    (two folds of the Mersenne reduction ``x = (x & P) + (x >> 31)``; no division)."""
    x = (x & P) + (x >> 31)
    return (x & P) + (x >> 31)


def _perm(x: torch.Tensor) -> torch.Tensor:
    """A value congruent to ``x**5`` modulo ``P`` (below ``2**31 + 2``), for int64 ``x`` below
    ``2**31 + 2`` (every product stays below 2**63)."""
    x2 = _fold(x * x)
    return _fold(_fold(x2 * x2) * x)


def digest(t: torch.Tensor, chunk_words: int = CHUNK_WORDS) -> tuple[int, int]:
    """The two 31-bit lanes of the digest of ``t``'s bytes (C order, any dtype, any device).

    The bytes are those of ``t.contiguous()``; shape and dtype are not part of the digest (the
    supervisor checks them on the revealed tensor). Cost: about ten elementwise int64 ops over
    the 32-bit words and as many over a tree of halving levels, on ``t``'s device, made
    ``chunk_words`` leaves at a time (rounded down to a power of two; any gives the same
    digest); one host synchronisation for the result.
    """
    flat = t.detach().contiguous().reshape(-1)
    nbytes = flat.numel() * flat.element_size()
    dev = flat.device
    raw = flat.view(torch.uint8)
    pad = (-nbytes) % 4
    if pad:
        raw = torch.cat([raw, torch.zeros(pad, dtype=torch.uint8, device=dev)])
    n = raw.numel() // 4
    words = raw.view(torch.int32) if n else raw
    consts = torch.tensor(_CONSTANTS, dtype=torch.int64, device=dev)  # (2 lanes, 5)
    a, b, m1, m2, c = (consts[:, i : i + 1] for i in range(5))  # each (2, 1)
    size = 1
    while size < max(n, 1):
        size *= 2
    block = min(size, 1 << (max(1, chunk_words).bit_length() - 1))  # a power of two
    roots: list[torch.Tensor] = []
    pad_root: torch.Tensor | None = None
    for start in range(0, size, block):
        if start >= n and pad_root is not None:  # a block of padding alone: the same root
            roots.append(pad_root)
            continue
        level = torch.full((2, block), _PAD_LEAF, dtype=torch.int64, device=dev)
        if start < n:
            part = words[start : min(n, start + block)].to(torch.int64)
            lo = (part & 0xFFFF).unsqueeze(0)
            hi = ((part >> 16) & 0xFFFF).unsqueeze(0)
            level[:, : part.numel()] = _fold(hi * a + lo + b)
            del part, lo, hi
        root = _reduce(level, m1, m2, c)
        pad_root = root if start >= n else pad_root
        roots.append(root)
    level = _reduce(torch.cat(roots, dim=1), m1, m2, c)
    lanes = torch.remainder(_perm(_fold(level * m1 + (nbytes % P) * m2 + c)), P).reshape(2)
    first, second = lanes.tolist()
    return int(first), int(second)


def _reduce(
    level: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor, c: torch.Tensor
) -> torch.Tensor:
    """The root ``(2, 1)`` of the tree over ``level`` (2 lanes x a power of two leaves)."""
    while level.shape[1] > 1:
        level = _perm(_fold(level[:, 0::2] * m1 + level[:, 1::2] * m2 + c))
    return level


def digests(values: list[torch.Tensor]) -> list[tuple[int, int]]:
    """:func:`digest` of each tensor in ``values``, in order."""
    return [digest(t) for t in values]
