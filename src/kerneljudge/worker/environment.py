"""What a process running candidate code inherits of the judge's environment variables.

:func:`candidate_environment` filters the supervisor's environment for every worker and build
process that runs candidate code; :data:`INDUCTOR_IN_PROCESS` keeps ``torch.compile`` in the
calling process (see :mod:`kerneljudge.worker.sandbox` for what the audit hook allows);
:func:`jit_cache_folders` names the folders where such a process's JIT compilers keep their
caches.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

__all__ = [
    "INDUCTOR_IN_PROCESS",
    "THREAD_BINDING",
    "candidate_environment",
    "candidates_cache_folders",
    "jit_cache_folders",
]

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION")
#: What a process running candidate code inherits of the judge's environment: the toolchain's
#: and the libraries' own settings, nothing else (no API keys, no configuration of the judge).
_ENV_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "SHELL",
        "LD_LIBRARY_PATH",
        "LIBRARY_PATH",
        "CPATH",
        "TMPDIR",
        "CC",
        "CXX",
        "MAX_JOBS",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "VIRTUAL_ENV",
        "SSL_CERT_FILE",
    }
)
_ENV_PREFIXES = (
    "CUDA_",
    "TORCH",
    "PYTORCH_",
    "TRITON_",
    "NVIDIA_",
    "NCCL_",
    "NVSHMEM_",
    "CUBLAS",
    "CUDNN",
    "LC_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "KMP_",
    "GOMP_",
    "XDG_CACHE_HOME",
)

#: OpenMP's thread-binding settings, passed on to no worker and no build: the judge pins its
#: workers itself (:meth:`kerneljudge.worker.runtime.Worker.op_pin`,
#: :func:`kerneljudge.worker.scheduling.pin_tree`), and a worker whose scheduling is locked
#: cannot bind a thread, so libgomp would abort at its first parallel region ("Thread creation
#: failed: Operation not permitted").
THREAD_BINDING = frozenset({"OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY"})

#: Settings that keep ``torch.compile`` (TorchInductor) inside the process that calls it, so that
#: a candidate using it starts no process but the compiler tools of :data:`COMPILER_TOOLS`:
#:
#: * ``TORCHINDUCTOR_COMPILE_THREADS=1``: kernels compile in the calling process, not in a pool
#:   of ``python -m torch._inductor.compile_worker`` subprocesses;
#: * ``TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=0``: no precompiled header, whose cache key
#:   is hashed by an ``openssl sha512`` child.
#:
#: They override the judge's own environment: a pool of compile workers would be refused. The
#: one other child CPU inductor starts, its vector-instruction probe (``python -c`` loading a
#: test library, see :func:`library_probe`), is allowed by the audit hook.
INDUCTOR_IN_PROCESS = {
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
    "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0",
}


def candidate_environment(base: dict[str, str]) -> dict[str, str]:
    """The part of ``base`` a process running candidate code may see: the names toolchains and
    libraries read (``PATH``, ``CUDA_*``, ``TORCH*``, ``TRITON_*``, ``OMP_*``, ...), minus any
    that look like credentials and :data:`THREAD_BINDING`, plus :data:`INDUCTOR_IN_PROCESS`."""
    env = {
        k: v
        for k, v in base.items()
        if (k in _ENV_NAMES or k.startswith(_ENV_PREFIXES))
        and not _SECRET_NAME.search(k.upper())
        and k not in THREAD_BINDING
    }
    env.update(INDUCTOR_IN_PROCESS)
    return env


def jit_cache_folders(env: Mapping[str, str], cuda: bool) -> list[str]:
    """The folders a process running candidate code with the environment ``env`` writes its JIT
    compilers' caches beneath: Triton's default ``~/.triton``, the folders ``TRITON_CACHE_DIR``
    and ``TORCHINDUCTOR_CACHE_DIR`` name, and with ``cuda`` the CUDA driver's (``CUDA_CACHE_PATH``,
    else ``~/.nv``). ``~`` is ``env``'s ``HOME``, else this process's home folder."""
    home = env.get("HOME") or os.path.expanduser("~")
    out = [os.path.join(home, ".triton")]
    if cuda:
        out.append(env.get("CUDA_CACHE_PATH") or os.path.join(home, ".nv"))
    return out + [env[v] for v in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR") if env.get(v)]


def candidates_cache_folders() -> list[str]:
    """The folders, resolved, where processes running candidate code started now would write
    their JIT compilers' caches: :func:`jit_cache_folders` of :func:`candidate_environment` of
    this process's environment, with ``~/.nv`` whether or not ``CUDA_CACHE_PATH`` names
    another folder now (it may not when a later process starts)."""
    env = candidate_environment(dict(os.environ))
    nv = os.path.join(env.get("HOME") or os.path.expanduser("~"), ".nv")
    return [os.path.realpath(f) for f in (nv, *jit_cache_folders(env, True))]
