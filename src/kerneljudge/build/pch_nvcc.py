"""What a shared prefix of a CUDA host compile (:mod:`kerneljudge.build.pch_cuda`) may be made
with, and what it depends on besides its options: the supervisor's side, beside
:mod:`kerneljudge.build.pch` (which makes and installs variants of both kinds).

A CUDA variant is made from a candidate's nvcc options, so only options that read no file of
their own and run no program of the candidate's are accepted (:func:`nvcc_refusal`); anything
else makes no shared prefix and the build goes on unchanged.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

from kerneljudge.build import pch_cuda, toolchain
from kerneljudge.build.pch import refusal, salt

__all__ = ["cuda_salt", "nvcc_refusal", "write_manifest"]


def cuda_salt() -> str:
    """SHA-256 of :func:`salt` and what else a CUDA variant's prefix depends on: nvcc (its
    path and ``--version``) and the host compiler nvcc runs by default (``gcc`` on the
    toolchain's ``PATH``: its path and ``--version``), and ``$CC`` (its ``--version``)."""
    home = toolchain.cuda_home() or ""
    gcc = shutil.which("gcc", path=toolchain.tool_path()) or "gcc"
    return _cuda_salt_of(salt(), os.path.join(home, "bin", "nvcc"), gcc, os.environ.get("CC", ""))


@functools.cache
def _cuda_salt_of(base: str, nvcc: str, gcc: str, cc: str) -> str:
    versions = []
    for tool in (nvcc, gcc, cc or gcc):
        try:
            out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30)
            versions.append(out.stdout.strip())
        except (OSError, subprocess.TimeoutExpired):
            versions.append("unavailable")
    blob = {
        "base": base,
        "nvcc": [nvcc, versions[0]],
        "gcc": [gcc, versions[1]],
        "cc": [cc, versions[2]],
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


_ARCH = r"(?:sm|compute|lto)_\d+[af]?"
#: nvcc options that read no file of their own and that a shared prefix may be made with.
_NVCC_PATTERNS = tuple(
    re.compile(p)
    for p in (
        r"--?(expt-relaxed-constexpr|expt-extended-lambda|extended-lambda|use_fast_math"
        r"|use-fast-math|lineinfo|generate-line-info|G|device-debug|restrict|res-usage"
        r"|resource-usage|disable-warnings)",
        r"--?(ftz|prec-div|prec-sqrt|fmad)=(true|false)",
        r"--?(maxrregcount|threads|split-compile)=\d+",
        rf"--?(arch|gpu-architecture|code|gpu-code)={_ARCH}(,{_ARCH})*",
        rf"--?(gencode|generate-code)=arch={_ARCH},code=\[?{_ARCH}(,{_ARCH})*\]?",
        r"--?diag[-_]suppress=[A-Za-z0-9_,]+",
        r"-W(no-deprecated-gpu-targets|no-deprecated-declarations|reorder|default-stream-launch"
        r"|ext-lambda-captures-this)",
    )
)
#: nvcc options whose value is the next argument, with the pattern of ``OPTION=VALUE``.
_NVCC_PAIRS = (
    "-gencode",
    "--generate-code",
    "-arch",
    "--gpu-architecture",
    "-code",
    "--gpu-code",
    "-maxrregcount",
    "--maxrregcount",
    "-t",
    "--threads",
)
_PTXAS = re.compile(
    r"-(v|O[0-3]|warn-spills|warn-lmem-usage|dlcm=c[ag]|dscm=(cg|cs|wb|wt))"
    r"|--(verbose|warn-on-spills|warn-on-local-memory-usage|maxrregcount=\d+"
    r"|allow-expensive-optimizations=(true|false))"
)


def toolchain_compilers() -> tuple[str, ...]:
    """The host compilers a prefix may be made with through ``-ccbin``, as spelled: ``$CC``
    of this process (torch's builder passes ``-ccbin $CC`` when it is set) and ``gcc``/``g++``
    as found on the toolchain's ``PATH``. Builds cannot change this process's environment,
    and a path of theirs (a link in their own folder to a real compiler) is not one of these."""
    found = [os.environ.get("CC") or ""]
    found += [shutil.which(name, path=toolchain.tool_path()) or "" for name in ("gcc", "g++")]
    return tuple(p for p in found if os.path.isabs(p) and os.path.isfile(p))


def nvcc_refusal(flags: list[str]) -> str | None:
    """Why no shared prefix is made for a CUDA compile with ``flags`` (its variant, see
    :func:`kerneljudge.build.pch_cuda.variant_flags`); None when one may be. Allowed: the
    host compiler's options :func:`refusal` allows; ``-Xcompiler``/``--compiler-options``
    with a list of those; ``-ccbin``/``--compiler-bindir`` of the toolchain's compiler
    (:func:`toolchain_compilers`); nvcc's code-generation, architecture and warning options
    (:data:`_NVCC_PATTERNS`); ``-Xptxas``/``--ptxas-options`` of :data:`_PTXAS`. Refused:
    any ``-Werror`` (the prefix's diagnostic pragmas are repeated, but not those of the headers
    inside it, so a warning the plain compile does not give could fail the build)."""
    if any("-Werror" in f or f in ("-W", "--Werror") for f in flags):
        return "-Werror (a precompiled header does not keep the prefix's diagnostic pragmas)"
    i = 0
    while i < len(flags):
        flag, value = flags[i], flags[i + 1] if i + 1 < len(flags) else None
        name, eq, inline = flag.partition("=")
        step = 1
        if name in ("-Xcompiler", "--compiler-options", "-Xptxas", "--ptxas-options") or (
            name in ("-ccbin", "--compiler-bindir")
        ):
            if not eq:
                if value is None:
                    return f"{flag} without a value"
                inline, step = value, 2
            if name in ("-ccbin", "--compiler-bindir"):
                if inline not in toolchain_compilers():
                    return f"{name} {inline}: not the toolchain's compiler"
            elif name in ("-Xptxas", "--ptxas-options"):
                if not all(_PTXAS.fullmatch(o) for o in inline.split(",")):
                    return f"{name} {inline}"
            else:
                reason = refusal(inline.split(","))
                if reason is not None:
                    return f"{name}: {reason}"
        elif flag in _NVCC_PAIRS and value is not None:
            if not any(p.fullmatch(f"{flag}={value}") for p in _NVCC_PATTERNS):
                return f"option {flag} {value}"
            step = 2
        elif not any(p.fullmatch(flag) for p in _NVCC_PATTERNS):
            if flag in ("-isystem", "-I") or flag.startswith(("-isystem", "-I")):
                reason = refusal(flags[i : i + 2] if flag in ("-isystem", "-I") else [flag])
                step = 2 if flag in ("-isystem", "-I") else 1
            else:
                reason = refusal([flag])
            if reason is not None:
                return reason
        i += step
    return None


def write_manifest(staging: Path, flags: list[str], salt_: str) -> None:
    """Finish a made CUDA variant in ``staging``: its manifest (sizes and SHA-256 of the prefix
    and its header, the host command it was made for, the options and the salt), the maker's
    other files removed, the two files made read-only.

    Raises:
        OSError: a made file is missing, not a regular file (a link), or ``tail.json`` is not
            a list of words.
    """
    prefix, gch, tail_file = (staging / n for n in (pch_cuda.PREFIX, pch_cuda.GCH, pch_cuda.TAIL))
    for made in (prefix, gch, tail_file):
        if not stat.S_ISREG(os.lstat(made).st_mode):
            raise OSError(f"{made.name} is not a regular file")
    try:
        tail = json.loads(tail_file.read_text())
    except ValueError as exc:
        raise OSError(f"{tail_file.name}: {exc}") from None
    if not (isinstance(tail, list) and all(isinstance(w, str) for w in tail)):
        raise OSError(f"{tail_file.name} is not a list of words")
    manifest = {
        "prefix_size": prefix.stat().st_size,
        "prefix_sha256": pch_cuda.digest(str(prefix)),
        "size": gch.stat().st_size,
        "sha256": pch_cuda.digest(str(gch)),
        "tail": tail,
        "flags": flags,
        "salt": salt_,
    }
    for left in staging.iterdir():
        if left.name not in (pch_cuda.PREFIX, pch_cuda.GCH, pch_cuda.TAIL):
            if left.is_dir() and not left.is_symlink():
                shutil.rmtree(left)
            else:
                left.unlink()
    (staging / pch_cuda.MANIFEST).write_text(json.dumps(manifest, indent=1))
    prefix.chmod(0o444)
    gch.chmod(0o444)
