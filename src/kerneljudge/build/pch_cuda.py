#!/usr/bin/env python3
"""The host compile of a CUDA file with a shared precompiled prefix of torch's headers.

nvcc's last step compiles ``cudafe++``'s output, ``NAME.cudafe1.cpp``, with the host compiler:
torch's ``torch/extension.h`` as ``cudafe++`` rewrote it (about 16 MB of preprocessed C++ on
torch 2.14), then the file's own code. For a ``.cu`` file that starts with the lines
``load_inline`` writes and then ``#include <torch/extension.h>`` (:data:`CANONICAL`), the
output of ``cudafe++`` up to the end of that header is the same bytes for every source compiled
with the same options and the same *module id* (the name ``cudafe++`` and ``cicc`` give the
file's anonymous namespaces). So:

* :func:`module_id` derives the module id from the compile's options and the source's name in
  its folder (``cuda.cu`` for every ``load_inline`` build), not from its text, when the
  options make a whole-program compile (:func:`shareable`: no relocatable device code, whose
  link-time registration symbols carry the id);
* the *prefix* of a variant (the options, :func:`variant_flags`) is cut from ``cudafe++``'s
  output for a source holding only those lines (:func:`precompile`, which the supervisor
  runs confined, :mod:`kerneljudge.build.pch`) and precompiled with the host compile's own
  command (GCC's ``-x c++-header``);
* a compile whose ``cudafe++`` output starts with exactly the prefix's bytes (compared in full)
  and whose host command is the variant's, less its file names, compiles instead, under the
  same file name and command, a file that includes the prefix, repeats the prefix's own
  diagnostic pragmas (GCC does not restore them from a precompiled header) and holds the rest:
  the same text, so the same program (GCC's manual, "Using Precompiled Headers": a
  precompiled header is used only where it was made with the options of the compile,
  otherwise the header's text is read). Any other case, and any failure of that compile, runs
  the host compile unchanged on the original file.

A variant's folder in the store (``$KERNELJUDGE_PCH_DIR``, key :func:`variant_key` with
``$KERNELJUDGE_CUDA_PCH_SALT``) holds ``prefix.h``, ``prefix.h.gch``, ``tail.json`` (the host
command the header was made with, file names replaced) and ``manifest.json`` (sizes and SHA-256
of both files, written by the supervisor). Standard library only: it runs inside
:mod:`kerneljudge.build.parallel_nvcc`, in the build worker, which can read the store but not
write it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys

if __package__:
    from kerneljudge.build.pch_cxx import digest
else:  # imported by parallel_nvcc.py run as a script: the module lies beside it
    from pch_cxx import digest  # type: ignore[import-not-found,no-redef]

__all__ = [
    "CANONICAL",
    "GCH",
    "MANIFEST",
    "PREFIX",
    "TAIL",
    "canonical_prefix",
    "digest",
    "module_id",
    "module_id_of",
    "normal_tail",
    "preamble_pragmas",
    "precompile",
    "shareable",
    "split_first_line",
    "starts_canonically",
    "state_of",
    "swap_in",
    "swap_out",
    "tail_shape",
    "variant_flags",
    "variant_key",
    "with_prefix",
]

#: The prefix's text and its precompiled header, in a variant's folder.
PREFIX = "prefix.h"
GCH = PREFIX + ".gch"
TAIL = "tail.json"
MANIFEST = "manifest.json"
#: The canonical source of a variant: the lines ``load_inline`` puts before a candidate's CUDA
#: sources, then the header a candidate's own source starts with.
CANONICAL = (
    "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
    "#include <torch/extension.h>\n"
)
#: Options that make relocatable device code or a device link (the module id then names
#: symbols that other objects refer to: it stays unique to the source's text).
_RELOCATABLE = (
    "-rdc",
    "--relocatable-device-code",
    "-dc",
    "--device-c",
    "-dw",
    "--device-w",
    "-dlink",
    "--device-link",
    "-dlto",
    "--dlink-time-opt",
    "-lto",
)
#: Options that name a file of the compile itself, with the value that follows them.
_FILE_VALUED = ("-c", "-o", "-MF", "--dependency-output", "-odir", "--output-directory")
#: The line of ``cudafe++``'s output that follows the source's own code: the stub's include.
_STUB = re.compile(rb'\n# 1 "[^"\n]*\.cudafe1\.stub\.c"\n')
#: A line marker that names its file (``# 61 "/usr/local/cuda/include/cuda_runtime.h" 3``).
_NAMED_MARKER = re.compile(rb'\n# \d+ "')
_DIAGNOSTIC = re.compile(rb"^#pragma GCC diagnostic [^\n]*\n", re.M)
#: Pragmas whose effect GCC does not carry through a precompiled header correctly (GCC bug
#: 105120 for ``optimize``): a prefix holding one is not made.
_CODEGEN_PRAGMA = re.compile(
    rb"^\s*#\s*pragma\s+GCC\s+(optimize|target|push_options|pop_options|reset_options)", re.M
)


def starts_canonically(source: str) -> bool:
    """Whether the first lines of ``source`` that are not blank are those of
    :data:`CANONICAL` (spaces around them aside)."""
    want = CANONICAL.splitlines()
    got: list[str] = []
    try:
        with open(source, errors="replace") as f:
            for line in f:
                if line.strip():
                    got.append(line.strip())
                if len(got) == len(want):
                    break
    except OSError:
        return False
    return got == want


def variant_flags(args: list[str], source: str) -> list[str]:
    """A compile's options less what names its files (``SOURCE``, ``-c``, ``-o FILE``,
    ``-MD``, ``-MF FILE``, ``--generate-dependencies-with-compile``,
    ``--dependency-output FILE``) and less ``-DTORCH_EXTENSION_NAME=...``, in order."""
    flags: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in _FILE_VALUED:
            i += 1 if arg == "-c" else 2
            continue
        if arg == source or arg in ("-MD", "--generate-dependencies-with-compile"):
            i += 1
            continue
        if not arg.startswith("-DTORCH_EXTENSION_NAME="):
            flags.append(arg)
        i += 1
    return flags


def shareable(flags: list[str]) -> bool:
    """Whether a compile with ``flags`` makes whole-program device code (none of
    :data:`_RELOCATABLE`, in any spelling ``-opt``, ``-opt=value``)."""
    for flag in flags:
        name = flag.split("=", 1)[0]
        if name in _RELOCATABLE or name.startswith(("-rdc", "--relocatable")):
            return False
    return True


def variant_key(flags: list[str], salt: str) -> str:
    """The store key of a CUDA variant: SHA-256 of ``"cuda"``, the salt and the flags."""
    return hashlib.sha256(json.dumps(["cuda", salt, flags]).encode()).hexdigest()


def module_id(flags: list[str], source: str) -> str:
    """A module id of nvcc's own shape (``_HASH_LEN_STEM_HASH``) from the options and the
    source's name: its base name when it lies in the working folder (where torch's builder
    runs nvcc for ``load_inline``'s ``cuda.cu``), else its whole real path."""
    real = os.path.realpath(source)
    name = os.path.basename(real) if os.path.dirname(real) == os.getcwd() else real
    h = hashlib.sha256(json.dumps(["module", flags, name]).encode()).hexdigest()
    return module_id_of(h, source)


def module_id_of(hex_: str, source: str) -> str:
    """A module id of nvcc's shape, ``_HASH_LEN_STEM_HASH``, from a hex digest (16 or more
    digits) and the source's base name."""
    stem = re.sub(r"[^A-Za-z0-9]", "_", os.path.basename(source)) or "src"
    return f"_{hex_[:8]}_{len(stem)}_{stem}_{hex_[8:16]}"


def split_first_line(text: bytes) -> tuple[bytes, bytes] | None:
    """``cudafe++``'s output split into its first line (the source's line marker) and the
    rest; None when it has no line break."""
    first, sep, rest = text.partition(b"\n")
    return (first, rest) if sep else None


def canonical_prefix(text: bytes) -> bytes | None:
    """The prefix of a canonical source's ``cudafe++`` output (:data:`CANONICAL`): after its
    first line, up to the line that includes the stub, without the blank lines before it;
    None when the stub's line is missing."""
    parts = split_first_line(text)
    if parts is None:
        return None
    m = _STUB.search(parts[1])
    if m is None:
        return None
    return parts[1][: m.start()].rstrip(b"\n") + b"\n"


def tail_shape(command: str) -> tuple[list[str], int, int] | None:
    """The host command as words, with the indexes of its ``.cudafe1.cpp`` input and its
    ``-o`` value; None when it is not one compile of one such file (or needs the shell)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    inputs = [i for i, w in enumerate(words) if w.endswith(".cudafe1.cpp")]
    outputs = [i + 1 for i, w in enumerate(words[:-1]) if w == "-o"]
    if len(inputs) != 1 or len(outputs) != 1 or "-c" not in words:
        return None
    if any(c in w for w in words for c in "$`;|&<>\n*?[]{}~#!\\"):
        return None  # the shell could read it otherwise than these words
    return words, inputs[0], outputs[0]


def normal_tail(words: list[str], source: int, output: int) -> list[str]:
    """The host command with its input and output replaced by placeholders."""
    out = list(words)
    out[source], out[output] = "<SOURCE>", "<OUTPUT>"
    return out


def state_of(folder: str) -> tuple[str, bytes, list[str]]:
    """``("ready", prefix bytes, tail)`` when the folder's prefix and header match its manifest
    (sizes and SHA-256; the prefix's bytes are those hashed), ``("missing", b"", [])`` without
    a manifest, ``("damaged", b"", [])`` otherwise."""
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return "missing", b"", []
    except (OSError, ValueError):
        return "damaged", b"", []
    try:
        if not isinstance(manifest, dict):
            return "damaged", b"", []
        with open(os.path.join(folder, PREFIX), "rb") as f:
            prefix = f.read()
        tail = manifest.get("tail")
        gch = os.path.join(folder, GCH)
        if (
            len(prefix) != manifest.get("prefix_size")
            or hashlib.sha256(prefix).hexdigest() != manifest.get("prefix_sha256")
            or not isinstance(tail, list)
            or os.path.getsize(gch) != manifest.get("size")
            or digest(gch) != manifest.get("sha256")
        ):
            return "damaged", b"", []
        return "ready", prefix, [str(w) for w in tail]
    except OSError:
        return "damaged", b"", []


def preamble_pragmas(prefix: bytes) -> bytes:
    """The ``#pragma GCC diagnostic`` lines of ``cudafe++``'s own preamble (the prefix's lines
    before its first line marker that names a file): the diagnostic state the whole file is
    compiled in. GCC does not restore diagnostic pragmas from a precompiled header, so they
    are repeated after its ``#include``."""
    m = _NAMED_MARKER.search(prefix)
    head = prefix if m is None else prefix[: m.start() + 1]
    return b"".join(m.group(0) for m in _DIAGNOSTIC.finditer(head))


def swap_in(path: str, prefix: bytes, header: str) -> str | None:
    """Put in place of ``path`` (a ``.cudafe1.cpp`` file) a file that includes ``header`` in
    place of ``prefix``, repeats the prefix's :func:`preamble_pragmas` and holds the rest, under
    the same name (the compile's input name makes a symbol of its static initialiser, and its
    stub is included by a name relative to its folder); the original moves to
    ``PATH.plain``, whose path is returned (:func:`swap_out` puts it back). None, and nothing
    changed, when ``path``'s text after its first line does not start with ``prefix`` or the
    rest does not start with a line marker naming its file (which keeps the rest's lines and
    file as they were)."""
    with open(path, "rb") as f:
        parts = split_first_line(f.read())
    if parts is None or not parts[1].startswith(prefix):
        return None
    rest = parts[1][len(prefix) :]
    if not _NAMED_MARKER.match(b"\n" + rest):
        return None
    include = b'#include "' + header.encode() + b'"\n'
    with open(path + ".kjpch", "wb") as f:
        f.write(parts[0] + b"\n" + include + preamble_pragmas(prefix) + rest)
    os.replace(path, path + ".plain")
    os.replace(path + ".kjpch", path)
    return path + ".plain"


def swap_out(kept: str) -> None:
    """Put back the original that :func:`swap_in` kept at ``kept``."""
    os.replace(kept, kept[: -len(".plain")])


def with_prefix(command: str, folder: str, prefix: bytes, tail: list[str]) -> str | None:
    """Make the host command compile through the variant in ``folder`` (:func:`swap_in` on its
    input); returns the kept original's path, or None when the command is not the variant's
    (:func:`normal_tail`) or its input does not start with the prefix."""
    shape = tail_shape(command)
    if shape is None:
        return None
    words, source, output = shape
    if normal_tail(words, source, output) != tail:
        return None
    return swap_in(words[source], prefix, os.path.join(folder, PREFIX))


def precompile(staging: str, flags: list[str]) -> int:
    """Make a variant's prefix and header in ``staging`` (the working folder): the canonical
    source compiled by nvcc's host branch with ``flags`` and the module id a candidate's
    ``cuda.cu`` gets, its prefix cut, then precompiled by the host command. Returns an exit
    status (messages on standard error)."""
    if __package__:
        from kerneljudge.build import parallel_nvcc
    else:  # run as a script, beside it
        import parallel_nvcc  # type: ignore[no-redef,import-not-found]

    source = os.path.join(staging, "cuda.cu")
    with open(source, "w") as f:
        f.write(CANONICAL)
    scratch = os.path.join(staging, "tmp")
    os.makedirs(scratch, exist_ok=True)
    nvcc = parallel_nvcc.real_nvcc()
    env = dict(os.environ, TMPDIR=scratch)
    args = [*flags, "-c", source, "-o", os.path.join(staging, "cuda.o")]
    dry = subprocess.run([nvcc, *args, "-dryrun"], env=env, capture_output=True, text=True)
    plan = parallel_nvcc.plan_of(dry.stdout + dry.stderr, scratch) if dry.returncode == 0 else None
    tails = [s for s in (plan.tail if plan else []) if tail_shape(s)]
    if plan is None or len(tails) != 1:
        print("nvcc's plan for the canonical source is not one host compile", file=sys.stderr)
        return 1
    with open(plan.module_id_path, "w") as f:
        f.write(module_id(flags, source))
    env.update(plan.env)
    for step in plan.host:
        if subprocess.run(step, shell=True, executable="/bin/bash", env=env).returncode != 0:
            return 1
    shape = tail_shape(tails[0])
    assert shape is not None
    words, src, out = shape
    with open(words[src], "rb") as f:
        prefix = canonical_prefix(f.read())
    if prefix is None:
        print("cudafe++'s output has no stub line", file=sys.stderr)
        return 1
    if _CODEGEN_PRAGMA.search(prefix):
        print("the prefix holds a code-generation pragma", file=sys.stderr)
        return 1
    with open(os.path.join(staging, PREFIX), "wb") as f:
        f.write(prefix)
    with open(os.path.join(staging, TAIL), "w") as f:
        json.dump(normal_tail(words, src, out), f)
    header = list(words)
    header[src], header[out] = os.path.join(staging, PREFIX), os.path.join(staging, GCH)
    kinds = [i + 1 for i, w in enumerate(header[:-1]) if w == "-x"]
    for i in kinds:
        header[i] = "c++-header"
    if not kinds:
        header[src:src] = ["-x", "c++-header"]
    return subprocess.run(header, env=env).returncode


if __name__ == "__main__":
    if sys.argv[1:2] != ["--precompile"] or len(sys.argv) < 3:
        print("usage: pch_cuda.py --precompile STAGING FLAGS...", file=sys.stderr)
        sys.exit(2)
    sys.exit(precompile(sys.argv[2], sys.argv[3:]))
