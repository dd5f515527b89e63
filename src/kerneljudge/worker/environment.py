"""What a process running candidate code inherits of the judge's environment variables.

:func:`candidate_environment` filters the supervisor's environment for every worker and build
process that runs candidate code; :data:`INDUCTOR_IN_PROCESS` keeps ``torch.compile`` in the
calling process (see :mod:`kerneljudge.worker.sandbox` for what the audit hook allows).
"""

from __future__ import annotations

import re

__all__ = ["INDUCTOR_IN_PROCESS", "candidate_environment"]

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
    that look like credentials, plus :data:`INDUCTOR_IN_PROCESS`."""
    env = {
        k: v
        for k, v in base.items()
        if (k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)) and not _SECRET_NAME.search(k.upper())
    }
    env.update(INDUCTOR_IN_PROCESS)
    return env
