"""The shared prefix of CUDA host compiles (kerneljudge.build.pch_cuda, pch_nvcc, parallel_nvcc).

The fast tests check the parts on small texts: the variant's options and module id, the cut of
the prefix, the exact-bytes rule that decides its use, the manifest check and the options a
prefix may be made with. The ``slow`` test builds real CUDA extensions (nvcc compiles without
a GPU): a second build uses the prefix the first one asked for, each extension keeps its own
defines, and a damaged header is never used and is made again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from test_pch import call_kj_value

from kerneljudge.build import BuildCache, build, pch, pch_cuda, pch_nvcc, toolchain
from kerneljudge.candidate import Candidate

TORCH_INCLUDE = str(pch.header_path().parents[1])
#: The options torch's builder gives nvcc for a ``load_inline`` CUDA file (as on this machine).
TORCH_FLAGS = [
    "-DTORCH_API_INCLUDE_EXTENSION_H",
    "-isystem",
    TORCH_INCLUDE,
    "-D_GLIBCXX_USE_CXX11_ABI=1",
    "-D__CUDA_NO_HALF_OPERATORS__",
    "--expt-relaxed-constexpr",
    "-gencode=arch=compute_90a,code=sm_90a",
    "--compiler-options",
    "-fPIC",
    "-O3",
    "--use_fast_math",
    "-std=c++20",
]


def test_variant_flags_drop_what_names_files_and_the_extension() -> None:
    args = ["-MD", "-MF", "x.o.d", "-DTORCH_EXTENSION_NAME=kj_a", *TORCH_FLAGS]
    args += ["-c", "/b/cuda.cu", "-o", "cuda.cuda.o"]
    assert pch_cuda.variant_flags(args, "/b/cuda.cu") == TORCH_FLAGS


@pytest.mark.parametrize("flag", ["-rdc=true", "-dc", "--relocatable-device-code=true", "-dlto"])
def test_relocatable_device_code_shares_nothing(flag: str) -> None:
    assert pch_cuda.shareable(TORCH_FLAGS)
    assert not pch_cuda.shareable([*TORCH_FLAGS, flag])


def test_the_module_id_follows_the_options_and_the_source_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "cuda.cu").write_text(f"// {d.name}\n")
    monkeypatch.chdir(a)
    in_a = pch_cuda.module_id(TORCH_FLAGS, str(a / "cuda.cu"))
    monkeypatch.chdir(b)
    in_b = pch_cuda.module_id(TORCH_FLAGS, str(b / "cuda.cu"))
    assert in_a == in_b  # two candidates' cuda.cu in their own build folders
    assert in_a.split("_")[2:4] == ["7", "cuda"]  # nvcc's shape: _HASH_LEN_STEM_..._HASH
    assert pch_cuda.module_id([*TORCH_FLAGS, "-DX=1"], str(b / "cuda.cu")) != in_b
    # A source outside the working folder (several files of one extension) keeps its path.
    assert pch_cuda.module_id(TORCH_FLAGS, str(a / "cuda.cu")) != in_b


def test_starts_canonically(tmp_path: Path) -> None:
    good = tmp_path / "good.cu"
    good.write_text(pch_cuda.CANONICAL.replace("\n", "\n\n") + "__global__ void k() {}\n")
    other = tmp_path / "other.cu"
    other.write_text(pch_cuda.CANONICAL.replace("#include <torch/extension.h>", "#define X 1"))
    assert pch_cuda.starts_canonically(str(good))
    assert not pch_cuda.starts_canonically(str(other))
    assert not pch_cuda.starts_canonically(str(tmp_path / "missing.cu"))


HEADER_PART = b"#pragma GCC diagnostic push\nnamespace at { int f(); }\n# 260\n}}\n"
CANONICAL_OUT = (
    b'# 1 "/s/cuda.cu"\n' + HEADER_PART + b'\n# 1 "/t/x-6_cuda.cudafe1.stub.c"\n#include "x"\n'
)
TAIL = 'gcc -std=c++20 -c -x c++ "{src}" -o "{out}" '


def test_the_prefix_is_cut_before_the_stub() -> None:
    assert pch_cuda.canonical_prefix(CANONICAL_OUT) == HEADER_PART
    assert pch_cuda.canonical_prefix(b'# 1 "a.cu"\nint x;\n') is None


def make_variant(folder: Path, prefix: bytes, tail: list[str], gch: bytes = b"gch") -> None:
    """Install a variant as :class:`pch.Precompiler` does (manifest of sizes and digests)."""
    folder.mkdir(parents=True)
    (folder / pch_cuda.PREFIX).write_bytes(prefix)
    (folder / pch_cuda.GCH).write_bytes(gch)
    manifest = {
        "prefix_size": len(prefix),
        "prefix_sha256": hashlib.sha256(prefix).hexdigest(),
        "size": len(gch),
        "sha256": hashlib.sha256(gch).hexdigest(),
        "tail": tail,
    }
    (folder / pch_cuda.MANIFEST).write_text(json.dumps(manifest))


def normal(command: str) -> list[str]:
    shape = pch_cuda.tail_shape(command)
    assert shape is not None
    return pch_cuda.normal_tail(*shape)


def test_a_compile_uses_the_prefix_only_on_exactly_its_bytes(tmp_path: Path) -> None:
    folder = tmp_path / "store" / "key"
    make_variant(folder, HEADER_PART, normal(TAIL.format(src="/t/c.cudafe1.cpp", out="c.o")))
    state, prefix, tail = pch_cuda.state_of(str(folder))
    assert state == "ready" and prefix == HEADER_PART
    source = tmp_path / "k.cudafe1.cpp"
    own = b'# 3 "/b/cuda.cu"\n__global__ void k();\n'
    source.write_bytes(b'# 1 "/b/cuda.cu"\n' + HEADER_PART + own)
    command = TAIL.format(src=source, out="cuda.cuda.o")
    original = b'# 1 "/b/cuda.cu"\n' + HEADER_PART + own
    kept = pch_cuda.with_prefix(command, str(folder), prefix, tail)
    # The input keeps its name (the compile's command is unchanged); the original is kept.
    assert kept == f"{source}.plain" and Path(kept).read_bytes() == original
    include = f'#include "{folder / pch_cuda.PREFIX}"\n'.encode()
    # The prefix's own diagnostic pragmas are repeated (GCC does not restore them from a
    # precompiled header).
    pragmas = b"#pragma GCC diagnostic push\n"
    assert source.read_bytes() == b'# 1 "/b/cuda.cu"\n' + include + pragmas + own
    pch_cuda.swap_out(kept)
    assert source.read_bytes() == original and not Path(kept).exists()
    # The rest must open with a marker naming its file (its lines and file stay as they were).
    source.write_bytes(b'# 1 "/b/cuda.cu"\n' + HEADER_PART + b"int x;\n" + own)
    assert pch_cuda.with_prefix(command, str(folder), prefix, tail) is None
    # One byte of the header part differs: the compile runs unchanged.
    source.write_bytes(b'# 1 "/b/cuda.cu"\n' + HEADER_PART.replace(b"f()", b"g()") + own)
    assert pch_cuda.with_prefix(command, str(folder), prefix, tail) is None
    # Another host command (an option more): unchanged too.
    source.write_bytes(original)
    other = command.replace("-std=c++20", "-std=c++20 -DMORE")
    assert pch_cuda.with_prefix(other, str(folder), prefix, tail) is None
    assert source.read_bytes() == original
    # A command that needs the shell is never rewritten.
    assert pch_cuda.tail_shape(command + " ; echo x") is None


@pytest.mark.parametrize("part", [pch_cuda.PREFIX, pch_cuda.GCH, pch_cuda.MANIFEST])
def test_a_damaged_variant_is_never_ready(tmp_path: Path, part: str) -> None:
    folder = tmp_path / "key"
    make_variant(folder, HEADER_PART, ["gcc"])
    assert pch_cuda.state_of(str(folder))[0] == "ready"
    data = bytearray((folder / part).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / part).write_bytes(bytes(data))
    assert pch_cuda.state_of(str(folder))[0] == "damaged"
    assert pch_cuda.state_of(str(tmp_path / "none"))[0] == "missing"


def test_preamble_pragmas_stop_at_the_first_named_file() -> None:
    prefix = (
        b'#pragma GCC diagnostic ignored "-Wattributes"\n# 1\nstatic char a;\n'
        b'#pragma GCC diagnostic push\n# 61 "/usr/include/x.h" 3\n'
        b'#pragma GCC diagnostic ignored "-Wshadow"\nint y;\n'
    )
    assert pch_cuda.preamble_pragmas(prefix) == (
        b'#pragma GCC diagnostic ignored "-Wattributes"\n#pragma GCC diagnostic push\n'
    )


def test_torch_options_may_make_a_shared_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    assert pch_nvcc.nvcc_refusal(TORCH_FLAGS) is None
    more = ["-Xptxas", "-v,-O3", "--maxrregcount=64", "-lineinfo", "-arch", "sm_90a"]
    assert pch_nvcc.nvcc_refusal([*TORCH_FLAGS, *more]) is None
    cc = "/usr/bin/cc"
    monkeypatch.setenv("CC", cc)  # torch's builder passes -ccbin $CC when CC is set
    if os.path.isfile(cc):
        assert pch_nvcc.nvcc_refusal(["-ccbin", cc, *TORCH_FLAGS]) is None


@pytest.mark.parametrize(
    "extra",
    [
        ["-include", "/tmp/x.h"],
        ["-I/tmp/candidate"],
        ["-isystem", "/tmp/candidate"],
        ["-Xcompiler", "-fplugin=/tmp/p.so"],
        ["--compiler-options", "-include,/tmp/x.h"],
        ["-ccbin", "/tmp/gcc"],
        ["--compiler-bindir=/tmp"],
        ["--options-file", "/tmp/o"],
        ["-Xptxas", "--input-as-string=x"],
        ["-Xcudafe", "--something"],
        ["--pre-include", "/tmp/x.h"],
        ["-gencode", "arch=compute_90,code=sm_90,/tmp"],
        ["-Xcompiler=-fplugin=/tmp/p.so"],
        ["--compiler-options=-include,/tmp/x.h"],
        ["-Xcompiler", "-Wall,-Werror"],
        ["-Werror", "all-warnings"],
    ],
)
def test_options_that_name_other_files_make_no_shared_prefix(extra: list[str]) -> None:
    assert pch_nvcc.nvcc_refusal([*TORCH_FLAGS, *extra]) is not None


def test_only_the_toolchain_compiler_may_be_the_host_compiler(tmp_path: Path) -> None:
    fake = tmp_path / "gcc"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert pch_nvcc.nvcc_refusal(["-ccbin", str(fake)]) is not None
    real = pch_nvcc.toolchain_compilers()
    if real:  # a link of a candidate's to the real compiler is not the real compiler's path
        link = tmp_path / "cc"
        link.symlink_to(real[0])
        assert pch_nvcc.nvcc_refusal(["-ccbin", str(link)]) is not None
        assert pch_nvcc.nvcc_refusal(["-ccbin", real[0]]) is None


def test_a_made_variant_with_a_link_is_not_installed(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / pch_cuda.PREFIX).write_bytes(HEADER_PART)
    (staging / pch_cuda.TAIL).write_text(json.dumps(["gcc"]))
    victim = tmp_path / "victim"
    victim.write_text("x")
    (staging / pch_cuda.GCH).symlink_to(victim)
    with pytest.raises(OSError, match="not a regular file"):
        pch_nvcc.write_manifest(staging, TORCH_FLAGS, "salt")
    assert victim.stat().st_mode & 0o200  # not made read-only through the link
    (staging / pch_cuda.GCH).unlink()
    (staging / pch_cuda.GCH).write_bytes(b"gch")
    (staging / pch_cuda.TAIL).write_text("{not json")
    with pytest.raises(OSError):
        pch_nvcc.write_manifest(staging, TORCH_FLAGS, "salt")


CUDA_TEMPLATE = '''
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
DEFINE_LINE
#ifndef KJ_VALUE
#define KJ_VALUE 0
#endif
namespace { __global__ void kj_kernel(float* y) { y[threadIdx.x] = KJ_VALUE; } }
int64_t kj_value() { return KJ_VALUE + (kj_kernel != nullptr); }
"""

_ext = load_inline(name="NAME", cpp_sources="int64_t kj_value();", cuda_sources=cuda_source,
                   functions=["kj_value"], extra_cuda_cflags=FLAGS)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x
'''


def built_value(
    cache: BuildCache, name: str, flags: list[str], define: str = ""
) -> tuple[int, str]:
    """Build a CUDA candidate (``define``: a line after its include), import its extension in
    a fresh interpreter (no GPU needed) and call ``kj_value``; returns the value and what its
    CUDA compile recorded."""
    source = CUDA_TEMPLATE.replace("NAME", name).replace("FLAGS", repr(flags))
    source = source.replace("DEFINE_LINE", define)
    # a time limit for a slow shared 2-core host, where a build beside its variant's making
    # took over 300 s (the default); the limit is not what this test checks
    result = build(
        Candidate.from_source(source, name=f"{name}.py"), cache=cache, arch="9.0", timeout_s=900.0
    )
    assert result.ok and not result.cached, result.log
    ext = cache.entry(result.cache_key) / "ext" / name
    record = json.loads(next(ext.glob("*.cuhost.json")).read_text())
    return call_kj_value(ext, name), record["state"]


@pytest.mark.slow
def test_real_cuda_builds_share_a_prefix_keep_their_defines_and_never_use_a_damaged_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two real CUDA builds: the first makes the shared prefix beside it, the second compiles
    through it with a define of its own. A damaged prefix is never ready
    (:func:`pch_cuda.state_of`, checked here on the made one and per part in
    ``test_a_damaged_variant_is_never_ready``), and a compile uses the prefix only when it is
    ready; the whole path of a damaged shared header (compiled without, made again) is built
    for real in ``test_pch.py`` (C++), through the same store. A third CUDA build here took
    over 5 minutes on a loaded 2-core host."""
    if not toolchain.cuda_home() or not toolchain.cuda_pch_enabled():
        pytest.skip("needs nvcc, Landlock and the shared headers")
    monkeypatch.setenv("KERNELJUDGE_PCH_DIR", str(tmp_path / "pch"))  # its own, damaged below
    cache = BuildCache(tmp_path / "cache")
    # The first build asks for its variant, which is made beside it.
    assert built_value(cache, "kj_cupch_a", ["-O2"]) == (1, "missing")
    # The next build with those options compiles through it, with its own define.
    assert built_value(cache, "kj_cupch_b", ["-O2"], "#define KJ_VALUE 6") == (7, "used")
    folders = [p for p in pch.variants(pch.store_dir(cache.root)) if (p / pch_cuda.TAIL).exists()]
    assert len(folders) == 1
    folder = folders[0]
    gch = folder / pch_cuda.GCH
    gch.chmod(0o644)
    with open(gch, "r+b") as f:  # one byte in the middle of the file
        f.seek(gch.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert pch_cuda.state_of(str(folder))[0] == "damaged"


def test_a_compile_that_went_without_the_prefix_asks_for_nothing(tmp_path: Path) -> None:
    entry = tmp_path / "entry"
    (entry / "ext" / "kj_x").mkdir(parents=True)
    record = entry / "ext" / "kj_x" / "cuda.cuda.o.cuhost.json"
    record.write_text(json.dumps({"flags": TORCH_FLAGS, "state": "unmatched"}))
    precompiler = pch.Precompiler(tmp_path / "store", entry, dict(os.environ), cuda=True)
    precompiler.poll()
    assert precompiler.finish() == "unmatched"


def test_the_supervisor_refuses_a_cuda_request_with_unsafe_options(tmp_path: Path) -> None:
    entry = tmp_path / "entry"
    (entry / "ext" / "kj_x").mkdir(parents=True)
    record = entry / "ext" / "kj_x" / "cuda.cuda.o.cuhost.json"
    flags = [*TORCH_FLAGS, "-Xcompiler", "-fplugin=/tmp/p.so"]
    record.write_text(json.dumps({"flags": flags, "state": "missing"}))
    precompiler = pch.Precompiler(tmp_path / "store", entry, dict(os.environ), cuda=True)
    precompiler.poll()
    assert precompiler.finish().startswith("refused: -Xcompiler")
    assert not (tmp_path / "store").exists() or not pch.variants(tmp_path / "store")
