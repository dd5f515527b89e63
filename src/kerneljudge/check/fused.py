"""One chunk's comparison statistics on a CUDA device from one elementwise kernel.

:func:`kerneljudge.check._chunk_stats` computes a chunk's ten statistics with about thirty
torch operations over float64 copies of the chunk, each a pass over device memory: a 976 MiB
float32 output (KernelBench's level-1 3-D convolution) took 76-103 ms per comparison on an
H100 that way, 13 comparisons per verdict. Here one kernel compiled at run time
(``torch.cuda.jiterator``, NVRTC; once per process, at a CUDA reference worker's start:
:func:`warm`) reads the chunk's reference, candidate and oracle elements in their own dtypes,
computes in float64 (the common dtype: the oracle is float64, and without an oracle the
reference chunk is made float64 first) and writes the masked per-element terms, which torch's
reductions then take to the chunk's row. Nothing waits for the device here.

Each term is the masked computation's, operation for operation: ``|a - e|``, ``|e|``, the
relative error ``|a - e| / max(|e|, atol)``, allclose's test ``|a - e| <= atol + rtol |e|``
(the product and the sum rounded separately, as torch computes them: no fused multiply-add),
``|a - o|``, ``|e - o|`` and ``|o|``, each set to 0 where the mask of
:func:`kerneljudge.check._chunk_stats` sets it to 0; the sums of squares are dot products of
those terms with themselves. The sums are reduced in another order than the masked
computation's, so they may differ from it in the last bits; maxima and flags are the same.

A chunk here is :data:`CHUNK` elements: with six float64 terms per element (768 MiB of
device memory for a chunk), a 976 MiB float32 output is 15 chunks, each some fifteen kernel
launches, where the torch operations' chunks of 2^22 elements made it 58 of some thirty.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["CHUNK", "available", "chunk_row", "warm"]

#: Elements per chunk of the fused comparison (2^24; see the module docstring).
CHUNK = 1 << 24
#: The dtypes the kernels take (promoted to float64 with the oracle's, or converted to it).
_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})

#: Not empty once the kernels failed to compile in this process (the torch operations are
#: used from then on).
_UNCOMPILED: list[bool] = []

# The per-element terms. ``kj_fin``: finite (NaN compares false; an infinity is above the
# largest double). ``kj_abs``: ``|x|`` with ``-0.0`` made ``+0.0``, as torch's ``abs`` gives
# it. ``flag``: 2 where the non-finite values of ``e`` and ``a`` differ (finiteness, or NaN
# against an infinity, or the infinities' signs), else 1 where allclose's test fails, else 0.
_COMMON = """
template <typename T> T kj_abs(T x) { return x < T(0) ? -x : x + T(0); }
template <typename T> bool kj_fin(T x) { return kj_abs<T>(x) <= T(1.7976931348623157e308); }
template <typename T> void kj_terms(T e, T a, T atol, T rtol, T& flag, T& d, T& rel) {
  bool ef = kj_fin<T>(e), af = kj_fin<T>(a);
  bool bad = (ef != af) || (!ef && !(e == a || (e != e && a != a)));
  T dd = ef ? kj_abs<T>(a - e) : T(0);
  T ea = ef ? kj_abs<T>(e) : T(0);
  T r = ef ? dd / (ea > atol ? ea : atol) : T(0);
  if (atol <= T(0) && r != r) r = T(0);
  bool close = dd <= __dadd_rn(atol, __dmul_rn(rtol, ea));
  flag = bad ? T(2) : (close ? T(0) : T(1));
  d = dd;
  rel = r;
}
"""
_WITH_ORACLE = """
template <typename T> void kj_compare_oracle(T e, T a, T o, T atol, T rtol, T& flag, T& d,
    T& rel, T& cand, T& refe, T& scale) {
  kj_terms<T>(e, a, atol, rtol, flag, d, rel);
  bool fin = kj_fin<T>(e) && kj_fin<T>(o);
  cand = fin ? kj_abs<T>(a - o) : T(0);
  refe = fin ? kj_abs<T>(e - o) : T(0);
  scale = fin ? kj_abs<T>(o) : T(0);
}
"""
_WITHOUT_ORACLE = """
template <typename T> void kj_compare(T e, T a, T atol, T rtol, T& flag, T& d, T& rel) {
  kj_terms<T>(e, a, atol, rtol, flag, d, rel);
}
"""


@functools.cache
def _kernel(oracle: bool) -> Callable[..., tuple[torch.Tensor, ...]]:
    from torch.cuda import jiterator

    source = _COMMON + (_WITH_ORACLE if oracle else _WITHOUT_ORACLE)
    jitted: Any = jiterator._create_multi_output_jit_fn(
        source, num_outputs=6 if oracle else 3, atol=0.0, rtol=0.0
    )
    return jitted


def available(where: torch.device, *tensors: torch.Tensor | None) -> bool:
    """Whether :func:`chunk_row` takes chunks of these tensors, copied to ``where``: a CUDA
    device, every tensor float16, bfloat16, float32 or float64 (jiterator promotes those to
    float64; it refuses float8 formats), the last (the oracle) float64 or None, and the kernels
    not known to fail in this process."""
    present = [t for t in tensors if t is not None]
    last = tensors[-1] if len(tensors) == 3 else None
    return (
        not _UNCOMPILED
        and where.type == "cuda"
        and bool(present)
        and all(t.dtype in _DTYPES for t in present)
        and (last is None or last.dtype == torch.float64)
    )


def chunk_row(
    e: torch.Tensor, a: torch.Tensor, o: torch.Tensor | None, atol: float, rtol: float
) -> torch.Tensor:
    """The row :func:`kerneljudge.check._chunk_stats` gives with ``lazy`` (``[non-finite
    mismatch (0/1), max_abs, sum_abs, max_rel, allclose (0/1), cand_max, cand_sq, ref_max,
    ref_sq, scale]``, float64, on the chunks' device, not waited for) of the 1-dim chunks
    ``e``, ``a`` (same length, the problem's floating dtype) and ``o`` (float64 or None).

    Raises:
        torch.cuda.OutOfMemoryError: the device had no room for the chunk's terms.
        RuntimeError: NVRTC could not compile the kernels (then every later call raises it too,
            and :func:`available` is False).
    """
    if _UNCOMPILED:
        raise RuntimeError("the fused comparison kernels did not compile in this process")
    try:
        if o is not None:
            flag, d, rel, c, f, s = _kernel(True)(e, a, o, atol=atol, rtol=rtol)
        else:
            flag, d, rel = _kernel(False)(e.to(torch.float64), a, atol=atol, rtol=rtol)
    except torch.cuda.OutOfMemoryError:
        raise
    except RuntimeError:
        _UNCOMPILED.append(True)
        raise
    worst = flag.max()
    parts = [(worst >= 2).double(), d.max(), d.sum(), rel.max(), (worst < 1).double()]
    if o is not None:
        parts += [c.max(), torch.dot(c, c), f.max(), torch.dot(f, f), s.max()]
    else:
        parts += [torch.zeros((), dtype=torch.float64, device=e.device)] * 5
    return torch.stack(parts)


def warm(device: torch.device) -> bool:
    """Compile both kernels on ``device`` (a CUDA device) now, on a few elements, for inputs
    of one dtype and of several (jiterator compiles those apart); torch's
    warnings meanwhile (its kernel cache on disk not writable in a confined worker) are
    dropped. Returns whether they compiled (False off CUDA and where the device was out of
    memory)."""
    if torch.device(device).type != "cuda":
        return False
    try:
        x = torch.ones(8, dtype=torch.float64, device=device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            chunk_row(x, x, x, 1e-5, 1e-5)  # one dtype: jiterator's vectorised variant
            chunk_row(x.float(), x.float(), x, 1e-5, 1e-5)  # mixed: its casting variant
            chunk_row(x.float(), x.float(), None, 1e-5, 1e-5)
    except torch.cuda.OutOfMemoryError:
        return False
    except RuntimeError:
        return False
    return True
