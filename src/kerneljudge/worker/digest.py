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

Every step is a function of residues modulo ``P``, so any evaluation order that keeps exact
residues gives the same bits. A CUDA tensor of :data:`FUSED_MIN_BYTES` or more is digested by two
kernels compiled at run time (``torch.cuda.jiterator``, NVRTC; once per process, at a CUDA
worker's start: :func:`warm`): one makes each aligned group of eight leaves and reduces it to its
subtree's root, the other reduces eight nodes of a level to their root, so each byte is read once
per lane and each level's nodes are written once, as 32-bit residues. Made of torch's elementwise
integer ops instead, a 6 GiB output took 894 ms on the H200, 287 times its call to ``relu``
(``benchmarks/timed_loop_steps.py``).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["CHUNK_WORDS", "FUSED_MIN_BYTES", "P", "digest", "digests", "warm"]

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
#: CUDA tensors of at least this many bytes are digested by the fused kernels (smaller ones
#: cost a few milliseconds the torch way, less than the kernels' first compilation).
FUSED_MIN_BYTES = 32 << 20
#: Bytes :func:`warm` digests: 1,024 words, a tree of height 10, so each kernel runs.
_WARM_BYTES = 4096
#: Not empty once the fused kernels failed to compile in this process.
_UNCOMPILED: list[bool] = []

# The fused kernels' source: residues kept below P in 64-bit arithmetic (every product of two
# values below 2**31 stays below 2**62), reduced by two Mersenne folds and a subtraction (a
# 64-bit ``%`` is a long instruction sequence on a GPU); the entry (the last function) returns
# a residue, which fits the 32-bit integers it is given.
_FUSED_COMMON = """
template <typename T> T kj_mod(T x) {{
  T y = (x & 2147483647LL) + (x >> 31);
  y = (y & 2147483647LL) + (y >> 31);
  return y >= 2147483647LL ? y - 2147483647LL : y;
}}
template <typename T> T kj_node(T l, T r) {{
  T x = kj_mod<T>(l * {m1}LL + r * {m2}LL + {c}LL);
  T x2 = kj_mod<T>(x * x);
  return kj_mod<T>(kj_mod<T>(x2 * x2) * x);
}}
template <typename T> T kj_leaf(T word) {{
  T u = word & 0xFFFFFFFFLL;
  return kj_mod<T>((u >> 16) * {a}LL + (u & 0xFFFFLL) + {b}LL);
}}
"""
_FUSED_ENTRY = """
template <typename T> T kj_digest_{kind}_{lane}(T v0, T v1, T v2, T v3, T v4, T v5, T v6, T v7) {{
  typedef long long W;
  W left = kj_node<W>(kj_node<W>({f}(v0), {f}(v1)), kj_node<W>({f}(v2), {f}(v3)));
  W right = kj_node<W>(kj_node<W>({f}(v4), {f}(v5)), kj_node<W>({f}(v6), {f}(v7)));
  return (T) kj_node<W>(left, right);
}}
"""


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


def digest(
    t: torch.Tensor, chunk_words: int = CHUNK_WORDS, fused: bool | None = None
) -> tuple[int, int]:
    """The two 31-bit lanes of the digest of ``t``'s bytes (C order, any dtype, any device).

    The bytes are those of ``t.contiguous()``; shape and dtype are not part of the digest (the
    supervisor checks them on the revealed tensor). ``fused`` (None: for CUDA tensors of
    :data:`FUSED_MIN_BYTES` or more) computes it with the fused kernels: each byte read once per
    lane, a few host synchronisations. Otherwise: about ten elementwise int64 ops over the
    32-bit words and as many over a tree of halving levels, on ``t``'s device, made
    ``chunk_words`` leaves at a time (rounded down to a power of two; any gives the same
    digest); one host synchronisation for the result. Both give the same digest.

    Raises:
        RuntimeError: ``fused`` true for a tensor not on a CUDA device, or NVRTC could not
            compile the kernels (with ``fused`` None the torch ops are used then, and for
            every later digest of this process).
    """
    flat = t.detach().contiguous().reshape(-1)
    nbytes = flat.numel() * flat.element_size()
    if fused is None:
        fused = flat.is_cuda and nbytes >= FUSED_MIN_BYTES and not _UNCOMPILED
        if fused:
            try:
                return _fused_digest(flat.view(torch.uint8))
            except torch.cuda.OutOfMemoryError:  # the same digest the slow way, this once
                pass
            except RuntimeError:  # no NVRTC here: not tried again in this process
                _UNCOMPILED.append(True)
    elif fused:
        if not flat.is_cuda:
            raise RuntimeError("the fused digest needs a CUDA tensor")
        return _fused_digest(flat.view(torch.uint8))
    dev = flat.device
    raw = flat.view(torch.uint8)
    pad = (-nbytes) % 4
    if pad:
        raw = torch.cat([raw, torch.zeros(pad, dtype=torch.uint8, device=dev)])
    n = raw.numel() // 4
    if n and raw.storage_offset() % 4:  # the bytes start off a 4-byte boundary
        raw = raw.clone()
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


def warm(device: torch.device) -> bool:
    """Compile the fused kernels on ``device`` (a CUDA device) now, by digesting 4 KiB of zeros
    with them: 1,024 words, so the leaf kernel and the node kernel each run once per lane with
    the strided arguments every later fused digest gives them. Warnings raised meanwhile are
    dropped (torch warns where its kernel cache on disk is not writable, as in a confined worker).

    Returns:
        True where they compiled; False for a device that is not a CUDA device, where the device
        was out of memory, and where the digest raised otherwise (NVRTC could not compile them),
        after which every digest of this process uses torch's ops (as :func:`digest` does after
        such a failure).

    Raises:
        RuntimeError: the 4 KiB could not be allocated on ``device`` (a device that fails).
    """
    if torch.device(device).type != "cuda":
        return False
    zeros = torch.zeros(_WARM_BYTES, dtype=torch.uint8, device=device)
    try:
        with warnings.catch_warnings():  # torch's, where its kernel cache is not writable
            warnings.simplefilter("ignore")
            digest(zeros, fused=True)
    except torch.cuda.OutOfMemoryError:  # not a compilation failure: a later digest tries again
        return False
    except RuntimeError:
        _UNCOMPILED.append(True)
        return False
    return True


def _node(lane: int, left: int, right: int) -> int:
    """A node's residue from its children's, in Python's exact integers."""
    _, _, m1, m2, c = _CONSTANTS[lane]
    return pow((left * m1 + right * m2 + c) % P, 5, P)


def _leaf(lane: int, word: int) -> int:
    a, b, _, _, _ = _CONSTANTS[lane]
    return ((word >> 16) * a + (word & 0xFFFF) + b) % P


def _up(lane: int, nodes: list[int], pad: int) -> list[int]:
    """The level above ``nodes`` (the first nodes of a level, in order; the rest are ``pad``)."""
    nodes = nodes + [pad] * (len(nodes) % 2)
    return [_node(lane, nodes[i], nodes[i + 1]) for i in range(0, len(nodes), 2)]


@functools.cache
def _pad_roots(lane: int, height: int) -> list[int]:
    """The root of an all-padding subtree of ``2**h`` leaves, for ``h`` from 0 to ``height``."""
    roots = [_PAD_LEAF % P]
    for _ in range(height):
        roots.append(_node(lane, roots[-1], roots[-1]))
    return roots


@functools.cache
def _kernel(kind: str, lane: int) -> Callable[..., torch.Tensor]:
    """The fused kernel ``kind`` (``leaf``: eight 32-bit words to the root of their eight leaves;
    ``node``: eight nodes to their root) of ``lane``, compiled at its first call."""
    a, b, m1, m2, c = _CONSTANTS[lane]
    source = _FUSED_COMMON.format(a=a, b=b, m1=m1, m2=m2, c=c)
    f = "kj_leaf<W>" if kind == "leaf" else "(W)"
    source += _FUSED_ENTRY.format(kind=kind, lane=lane, f=f)
    from torch.cuda import jiterator

    jitted: Any = jiterator._create_jit_fn(source)
    return jitted


def _fused_digest(raw: torch.Tensor) -> tuple[int, int]:
    """:func:`digest` of the bytes ``raw`` (uint8, 1-D, contiguous, on a CUDA device) by the
    fused kernels: the whole groups of eight words on the device, the last partial group
    (fewer than 32 bytes) and the top levels (at most eight nodes) in Python's integers."""
    nbytes = raw.numel()
    n = -(-nbytes // 4)
    height = max(0, (n - 1).bit_length())  # the tree has 2**height leaves
    if height < 3:  # fewer than eight leaves in all
        return digest(raw, fused=False)
    main = (nbytes // 32) * 32
    words = raw[:main] if raw.storage_offset() % 4 == 0 else raw[:main].clone()
    words = words.view(torch.int32)
    columns = words.view(-1, 8).unbind(1)
    tail = bytes(raw[main:].cpu().tolist())
    tail += bytes(-len(tail) % 4)
    lanes = []
    for lane in (0, 1):
        pads = _pad_roots(lane, height)
        level = _kernel("leaf", lane)(*columns) if main else words[:0]
        last: list[int] = []
        if tail:
            last = [_leaf(lane, int.from_bytes(tail[i : i + 4], "little"))
                    for i in range(0, len(tail), 4)]  # fmt: skip
            for k in range(3):
                last = _up(lane, last, pads[k])
        h = 3  # the height of the nodes in ``level`` and ``last``
        while height - h >= 3 and level.numel() + len(last) > 8:
            if last:
                extra = torch.tensor(last, dtype=torch.int32, device=level.device)
                level = torch.cat([level, extra])
                last = []
            short = -level.numel() % 8
            if short:
                fill = torch.full((short,), pads[h], dtype=torch.int32, device=level.device)
                level = torch.cat([level, fill])
            level = _kernel("node", lane)(*level.view(-1, 8).unbind(1))
            h += 3
        nodes = [int(v) for v in level.tolist()] + last
        for k in range(h, height):
            nodes = _up(lane, nodes, pads[k])
        root = nodes[0] if nodes else pads[height]
        lanes.append(_node(lane, root, nbytes % P))
    return lanes[0], lanes[1]
