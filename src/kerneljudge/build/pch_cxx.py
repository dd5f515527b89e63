#!/usr/bin/env python3
"""The C++ compiler of candidate builds: the real one, given a shared precompiled
``torch/extension.h`` where one fits.

Every C++ translation unit that ``load_inline`` writes (``main.cpp``: the candidate's C++
sources and the generated bindings) starts with ``#include <torch/extension.h>``, and parsing
that header is most of the compile. GCC uses a precompiled header ``extension.h.gch`` found in
an include folder in place of the header itself when it was made with the same options (GCC's
manual, "Using Precompiled Headers"); otherwise it ignores it and reads the header.

A *variant* is one compile's options less what names its files (``-MMD``, ``-MF FILE``,
``-c SOURCE``, ``-o OUTPUT``) and less ``-DTORCH_EXTENSION_NAME=...`` (only the bindings after
the header use it). Its key is the SHA-256 of the variant and ``$KERNELJUDGE_PCH_SALT`` (the
toolchain, set by the supervisor). The store (``$KERNELJUDGE_PCH_DIR``) holds one folder per
key: ``include/torch/extension.h.gch``, a link ``include/torch/extension.h`` to torch's header,
and ``manifest.json`` (the header's path, the ``.gch`` file's ``sha256`` and ``size``).

Run by ninja as ``$CXX`` (torch's extension builder takes the compiler from ``CXX``), inside
the confined build worker, which can read the store but not write it. For the compile of a
source whose first line is ``#include <torch/extension.h>``:

* the variant's header is present and its bytes match the manifest: the compile gets
  ``-I STORE/KEY/include`` ahead of its own folders, and the store's path is taken out of the
  dependency file afterwards (ninja would otherwise rebuild when the store changes);
* otherwise: the compile runs unchanged, and its record asks the supervisor to make it
  (:mod:`kerneljudge.build.pch`), which decides for itself whether the options are safe to
  make a shared header with.

The record, ``OUTPUT.pch.json``, is ``{"flags": [...], "state": "used" | "missing" |
"damaged"}`` (``used``: the supervisor marks the variant as just used).

Any other command (links, ``-v``) runs the real compiler unchanged. The real compiler is
``$KERNELJUDGE_CXX``, else ``c++``. ``python -m kerneljudge.build.pch_cxx --precompile OUT
FLAGS...`` makes a header (the supervisor runs it confined). Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

__all__ = ["HEADER", "compile_parts", "digest", "main", "variant_key"]

#: The header a variant precompiles, as sources include it.
HEADER = "torch/extension.h"
_FIRST_LINE = f"#include <{HEADER}>"
#: Where a variant's header lies in its folder, relative to it.
GCH = os.path.join("include", "torch", "extension.h.gch")
#: A link to torch's own header beside it: a source that includes the header again finds it
#: there (GCC looks for the header in the folder where it found the precompiled one).
LINK = os.path.join("include", "torch", "extension.h")
MANIFEST = "manifest.json"


def real_compiler() -> str:
    return os.environ.get("KERNELJUDGE_CXX") or "c++"


def compile_parts(args: list[str]) -> tuple[list[str], str, str, str | None] | None:
    """Split one compile's arguments into ``(variant flags, source, output, depfile)``; None
    when they are not a single ``-c SOURCE -o OUTPUT`` compile."""
    flags: list[str] = []
    source = output = depfile = None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-c", "-o", "-MF"):
            if i + 1 >= len(args):
                return None
            value = args[i + 1]
            if arg == "-c":
                if source is not None:
                    return None
                source = value
            elif arg == "-o":
                if output is not None:
                    return None
                output = value
            else:
                depfile = value
            i += 2
            continue
        if arg != "-MMD" and not arg.startswith("-DTORCH_EXTENSION_NAME="):
            flags.append(arg)
        i += 1
    if source is None or output is None:
        return None
    return flags, source, output, depfile


def variant_key(flags: list[str], salt: str) -> str:
    """The store key of a variant: SHA-256 of the salt and the flags, in order."""
    return hashlib.sha256(json.dumps([salt, flags]).encode()).hexdigest()


def digest(path: str) -> str:
    """SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def state_of(folder: str) -> str:
    """``"ready"`` when ``folder``'s header matches its manifest (size and SHA-256) and its
    link leads to the manifest's header (which is ``$KERNELJUDGE_PCH_HEADER`` when that is
    set), ``"missing"`` when there is no manifest, ``"damaged"`` otherwise."""
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError):
        return "damaged"
    gch = os.path.join(folder, GCH)
    header = os.environ.get("KERNELJUDGE_PCH_HEADER")
    try:
        if not isinstance(manifest, dict) or os.path.getsize(gch) != manifest.get("size"):
            return "damaged"
        if os.path.realpath(os.path.join(folder, LINK)) != manifest.get("header") or (
            header and manifest.get("header") != header
        ):
            return "damaged"
        return "ready" if digest(gch) == manifest.get("sha256") else "damaged"
    except OSError:
        return "damaged"


def _starts_with_header(source: str) -> bool:
    try:
        with open(source, errors="replace") as f:
            for line in f:
                if line.strip():
                    return line.strip() == _FIRST_LINE
    except OSError:
        pass
    return False


def _drop_from_depfile(depfile: str, folder: str) -> None:
    """Take every path inside ``folder`` out of a make-style dependency file."""
    try:
        with open(depfile) as f:
            text = f.read()
    except OSError:
        return
    lines = []
    for line in text.replace("\\\n", " \\\n").split("\n"):
        kept = [tok for tok in line.split(" ") if not tok.startswith(folder)]
        lines.append(" ".join(kept))
    with open(depfile, "w") as f:
        f.write("\n".join(lines))


def main(argv: list[str]) -> int:
    real = real_compiler()
    if argv[:1] == ["--precompile"] and len(argv) >= 2:
        out, flags = argv[1], argv[2:]
        cmd = [real, "-x", "c++-header", *flags, os.environ["KERNELJUDGE_PCH_HEADER"], "-o", out]
        return subprocess.run(cmd, check=False).returncode
    store = os.environ.get("KERNELJUDGE_PCH_DIR")
    parts = compile_parts(argv)
    if not store or parts is None or not _starts_with_header(parts[1]):
        os.execvp(real, [real, *argv])
    flags, _, output, depfile = parts
    folder = os.path.join(store, variant_key(flags, os.environ.get("KERNELJUDGE_PCH_SALT", "")))
    state = state_of(folder)
    if state != "ready":
        _record(output, flags, state)
        os.execvp(real, [real, *argv])
    include = os.path.join(folder, "include")
    code = subprocess.run([real, "-I", include, *argv], check=False).returncode
    if depfile is not None:
        _drop_from_depfile(depfile, folder)
    _record(output, flags, "used")
    return code


def _record(output: str, flags: list[str], state: str) -> None:
    """``OUTPUT.pch.json``: the compile's variant and what it found (``used``, ``missing``,
    ``damaged``), for the supervisor."""
    try:
        with open(output + ".pch.json", "w") as f:
            json.dump({"flags": flags, "state": state}, f)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
