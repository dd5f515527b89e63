"""Shared precompiled headers of C++ builds (kerneljudge.build.pch and pch_cxx).

Most tests stand a small script in for the real compiler (``CXX``/``KERNELJUDGE_CXX``), so
they check what the wrapper passes on, what it asks for and what the supervisor makes and
refuses, in seconds. The ``slow`` ones build real extensions with the real compiler: options
and defines honoured through the wrapper, a damaged shared header made again and never used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kerneljudge.build import BuildCache, build, pch, pch_cxx, toolchain
from kerneljudge.candidate import Candidate

TORCH_INCLUDE = str(pch.header_path().parents[1])
BASE = [
    "-DTORCH_API_INCLUDE_EXTENSION_H",
    "-isystem",
    TORCH_INCLUDE,
    "-isystem",
    os.path.join(TORCH_INCLUDE, "torch", "csrc", "api", "include"),
    "-fPIC",
    "-std=c++20",
]

#: Stands in for the real compiler: records its arguments, and for ``-o OUT`` writes OUT.
FAKE_CXX = """#!/bin/sh
printf '%s\\n' "$@" > "$KJ_FAKE_ARGS"
out=""
prev=""
for a in "$@"; do
  if [ "$prev" = "-o" ]; then out="$a"; fi
  prev="$a"
done
case "$*" in *-DKJ_FAIL*) echo "error: no" >&2; exit 1;; esac
if [ -n "$out" ]; then printf 'made with %s\\n' "$*" > "$out"; fi
exit 0
"""


@pytest.fixture
def fake_cxx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in compiler as ``$CXX``; returns the file its last arguments go to."""
    script = tmp_path / "fake-cxx"
    script.write_text(FAKE_CXX)
    script.chmod(0o755)
    args = tmp_path / "args.txt"
    monkeypatch.setenv("CXX", str(script))
    monkeypatch.setenv("KERNELJUDGE_CXX", str(script))
    monkeypatch.setenv("KJ_FAKE_ARGS", str(args))
    return args


def run_wrapper(args: list[str], store: Path, cwd: Path) -> list[str]:
    """Run the wrapper as ninja would; returns what the real compiler got."""
    env = dict(os.environ, **pch.environment(store))
    env["KERNELJUDGE_CXX"] = os.environ["KERNELJUDGE_CXX"]
    subprocess.run([str(toolchain.PCH_WRAPPER), *args], cwd=cwd, env=env, check=True)
    return Path(os.environ["KJ_FAKE_ARGS"]).read_text().splitlines()


def compile_args(flags: list[str]) -> list[str]:
    return ["-MMD", "-MF", "main.o.d", "-DTORCH_EXTENSION_NAME=kj_x", *flags]


def make_variant(store: Path, flags: list[str], body: bytes = b"header") -> Path:
    """Install a variant the way :class:`pch.Precompiler` does, with ``body`` as its header."""
    folder = store / pch_cxx.variant_key(flags, pch.salt())
    (folder / pch_cxx.GCH).parent.mkdir(parents=True)
    (folder / pch_cxx.GCH).write_bytes(body)
    os.symlink(pch.header_path(), folder / pch_cxx.LINK)
    manifest = {
        "header": str(pch.header_path()),
        "sha256": pch_cxx.digest(str(folder / pch_cxx.GCH)),
        "size": len(body),
    }
    (folder / pch_cxx.MANIFEST).write_text(json.dumps(manifest))
    return folder


def test_compile_parts_keep_the_options_and_drop_what_names_files() -> None:
    args = [*compile_args([*BASE, "-O3"]), "-c", "/e/main.cpp", "-o", "main.o"]
    flags, source, output, depfile = pch_cxx.compile_parts(args) or ([], "", "", None)
    assert flags == [*BASE, "-O3"]
    assert (source, output, depfile) == ("/e/main.cpp", "main.o", "main.o.d")
    assert pch_cxx.compile_parts(["main.o", "-shared", "-o", "x.so"]) is None  # a link
    assert pch_cxx.compile_parts(["-v"]) is None
    assert pch_cxx.compile_parts(["-c", "a.cpp", "-c", "b.cpp", "-o", "x.o"]) is None
    # The options in order make the key: the same options in another order are another variant.
    assert pch_cxx.variant_key(["-O3", "-fPIC"], "s") != pch_cxx.variant_key(["-fPIC", "-O3"], "s")
    assert pch_cxx.variant_key(["-O3"], "s") != pch_cxx.variant_key(["-O3"], "t")


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["-O3"],
        ["-O2", "-march=native", "-fopenmp", "-ffast-math", "-funroll-loops"],
        ["-DKJ_VALUE=7", '-DPYBIND11_COMPILER_TYPE="_gcc"', "-UNDEBUG", "-w", "-Wall", "-g"],
        ["-isystem", "/usr/local/cuda/include"] if toolchain.cuda_home() else [],
    ],
)
def test_the_toolchain_own_options_may_make_a_shared_header(extra: list[str]) -> None:
    assert pch.refusal([*BASE, *extra]) is None


@pytest.mark.parametrize(
    "extra",
    [
        ["-include", "evil.h"],
        ["-I/tmp/candidate"],
        ["-I", "/tmp/candidate"],
        ["-isystem", "/tmp/candidate/torch"],
        ["-isystem", os.path.join(TORCH_INCLUDE, "..", "..", "..", "..")],
        ["-fplugin=evil"],
        ["-fprofile-use=data"],
        ["-Wp,-include,evil.h"],
        ["-Wl,-rpath,/tmp"],
        ["@options.rsp"],
        ["-DX=/tmp/y"],
        ["-specs=evil.specs"],
        ["-B/tmp/tools"],
        ["-iquote", "."],
        ["-x", "c"],
        ["-fdeps-file=x"],
        ["-fmodule-mapper=x"],
        ["-isystem", TORCH_INCLUDE + "/"],
        ["-isystem", TORCH_INCLUDE + "/torch/../torch"],
    ],
)
def test_options_that_name_other_files_make_no_shared_header(extra: list[str]) -> None:
    assert pch.refusal([*BASE, *extra]) is not None


def test_the_wrapper_asks_for_a_missing_header_and_compiles_unchanged(
    fake_cxx: Path, tmp_path: Path
) -> None:
    source = tmp_path / "main.cpp"
    source.write_text("#include <torch/extension.h>\nint f() { return 1; }\n")
    args = [*compile_args([*BASE, "-O3"]), "-c", str(source), "-o", "main.o"]
    assert run_wrapper(args, tmp_path / "store", tmp_path) == args
    asked = json.loads((tmp_path / "main.o.pch.json").read_text())
    assert asked == {"flags": [*BASE, "-O3"], "state": "missing"}


def test_the_wrapper_gives_a_verified_header_and_leaves_other_compiles_alone(
    fake_cxx: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    folder = make_variant(store, [*BASE, "-O3"])
    source = tmp_path / "main.cpp"
    source.write_text("\n#include <torch/extension.h>\n")
    args = [*compile_args([*BASE, "-O3"]), "-c", str(source), "-o", "main.o"]
    assert run_wrapper(args, store, tmp_path) == ["-I", str(folder / "include"), *args]
    record = json.loads((tmp_path / "main.o.pch.json").read_text())
    assert record == {"flags": [*BASE, "-O3"], "state": "used"}
    (tmp_path / "main.o.pch.json").unlink()
    # Another source (not opening with the header), a link and `-v` run unchanged, asking nothing.
    other = tmp_path / "kernel.cpp"
    other.write_text("#include <cmath>\n#include <torch/extension.h>\n")
    plain = [*compile_args([*BASE, "-O3"]), "-c", str(other), "-o", "kernel.o"]
    for cmd in (plain, ["main.o", "-shared", "-o", "x.so"], ["-v"]):
        assert run_wrapper(cmd, store, tmp_path) == cmd
    assert not list(tmp_path.glob("*.pch.json"))


def test_the_wrapper_never_gives_a_damaged_header(fake_cxx: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    source = tmp_path / "main.cpp"
    source.write_text("#include <torch/extension.h>\n")
    args = [*compile_args(BASE), "-c", str(source), "-o", "main.o"]
    folder = make_variant(store, BASE, b"precompiled bytes")
    gch = folder / pch_cxx.GCH
    gch.write_bytes(b"precompiled BYTES")  # same size, other bytes
    assert run_wrapper(args, store, tmp_path) == args
    assert json.loads((tmp_path / "main.o.pch.json").read_text())["state"] == "damaged"
    gch.write_bytes(b"precompiled bytes")
    (folder / pch_cxx.LINK).unlink()
    os.symlink(source, folder / pch_cxx.LINK)  # the link leads elsewhere
    assert run_wrapper(args, store, tmp_path) == args
    assert pch_cxx.state_of(str(folder)) == "damaged"


def test_the_dependency_file_never_names_the_store(tmp_path: Path) -> None:
    """ninja keeps the dependencies it reads; one inside the store would rebuild a cached
    candidate in its run worker whenever the store changes."""
    depfile = tmp_path / "main.o.d"
    folder = tmp_path / "store" / "abc"
    depfile.write_text(
        f"main.o: /e/main.cpp \\\n {folder}/include/torch/extension.h.gch \\\n /e/kernel.h\n"
    )
    pch_cxx._drop_from_depfile(str(depfile), str(folder))
    text = depfile.read_text()
    assert str(folder) not in text and "/e/main.cpp" in text and "/e/kernel.h" in text


def ask(entry: Path, flags: list[str], state: str = "missing") -> None:
    folder = entry / "ext" / "kj_x"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "main.o.pch.json").write_text(json.dumps({"flags": flags, "state": state}))


def test_the_supervisor_makes_an_asked_variant_confined_and_read_only(
    fake_cxx: Path, tmp_path: Path
) -> None:
    store, entry = tmp_path / "store", tmp_path / "entry"
    ask(entry, [*BASE, "-O3"])
    maker = pch.Precompiler(store, entry, dict(os.environ))
    maker.poll()
    assert maker.finish() == "made"
    folder = store / pch_cxx.variant_key([*BASE, "-O3"], pch.salt())
    assert pch_cxx.state_of(str(folder)) == "ready"
    made = (folder / pch_cxx.GCH).read_text()
    assert "-x c++-header" in made and str(pch.header_path()) in made and "-O3" in made
    assert not (folder / pch_cxx.GCH).stat().st_mode & 0o222
    assert not list((store / ".staging").iterdir())
    # Asked again: it is there, nothing is made.
    again = pch.Precompiler(store, entry, dict(os.environ))
    assert again.finish() == "ready"


def test_the_supervisor_makes_a_damaged_variant_again(fake_cxx: Path, tmp_path: Path) -> None:
    store, entry = tmp_path / "store", tmp_path / "entry"
    folder = make_variant(store, BASE, b"x" * 100)
    (folder / pch_cxx.GCH).write_bytes(b"y" * 100)
    ask(entry, BASE, "damaged")
    assert pch.Precompiler(store, entry, dict(os.environ)).finish() == "made"
    assert pch_cxx.state_of(str(folder)) == "ready"
    assert b"c++-header" in (folder / pch_cxx.GCH).read_bytes()
    # A request that says "damaged" of a sound variant makes nothing.
    assert pch.Precompiler(store, entry, dict(os.environ)).finish() == "ready"


def test_the_supervisor_refuses_unsafe_requests(fake_cxx: Path, tmp_path: Path) -> None:
    store, entry = tmp_path / "store", tmp_path / "entry"
    ask(entry, [*BASE, "-include", "/tmp/evil.h"])
    outcome = pch.Precompiler(store, entry, dict(os.environ)).finish()
    assert outcome.startswith("refused") and "-include" in outcome
    (entry / "ext" / "kj_x" / "main.o.pch.json").write_text('{"flags": "-O3"}')
    assert pch.Precompiler(store, entry, dict(os.environ)).finish().startswith("refused")
    assert not store.exists() or not [p for p in store.iterdir() if not p.name.startswith(".")]


def test_a_variant_the_compiler_fails_on_is_not_tried_again(fake_cxx: Path, tmp_path: Path) -> None:
    store, entry = tmp_path / "store", tmp_path / "entry"
    ask(entry, [*BASE, "-DKJ_FAIL"])
    assert "the compiler failed" in pch.Precompiler(store, entry, dict(os.environ)).finish()
    again = pch.Precompiler(store, entry, dict(os.environ)).finish()
    assert again == "not made: it failed within the last hour"
    assert not [p for p in store.iterdir() if not p.name.startswith(".")]


def test_a_link_of_a_candidate_to_the_toolchain_is_not_trusted(tmp_path: Path) -> None:
    """A folder that leads to torch's headers through a link a candidate could change later."""
    link = tmp_path / "entry" / "inc"
    link.parent.mkdir()
    os.symlink(TORCH_INCLUDE, link)
    assert pch.refusal([*BASE, "-isystem", str(link)]) is not None


@pytest.mark.parametrize("kind", ["fifo", "link", "huge", "deep", "nul", "state"])
def test_a_hostile_record_is_refused_and_the_build_goes_on(
    fake_cxx: Path, tmp_path: Path, kind: str
) -> None:
    """A record is a candidate's file: a FIFO (which would block a reader), a link, endless
    or deeply nested JSON, a NUL in a path, an unknown state: each is refused, none raises."""
    store, entry = tmp_path / "store", tmp_path / "entry"
    folder = entry / "ext" / "kj_x"
    folder.mkdir(parents=True)
    record = folder / "main.o.pch.json"
    if kind == "fifo":
        os.mkfifo(record)
    elif kind == "link":
        target = tmp_path / "elsewhere.json"
        target.write_text(json.dumps({"flags": BASE, "state": "missing"}))
        os.symlink(target, record)
    elif kind == "huge":
        record.write_text(json.dumps({"flags": BASE, "state": "missing", "x": "y" * (1 << 17)}))
    elif kind == "deep":
        record.write_text("[" * 100_000)
    elif kind == "nul":
        record.write_text(json.dumps({"flags": ["-I", "/a\u0000b"], "state": "missing"}))
    else:
        record.write_text(json.dumps({"flags": BASE, "state": "made"}))
    maker = pch.Precompiler(store, entry, dict(os.environ))
    maker.poll()
    assert maker.finish().startswith(("refused", "not made"))
    assert not store.exists() or not pch.variants(store)


def test_the_store_keeps_its_most_recently_used_variants(
    fake_cxx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KERNELJUDGE_PCH_VARIANTS", "2")
    store, entry = tmp_path / "store", tmp_path / "entry"
    keys = []
    for i in range(3):
        flags = [*BASE, f"-DKJ_N={i}"]
        keys.append(pch_cxx.variant_key(flags, pch.salt()))
        ask(entry, flags)
        assert pch.Precompiler(store, entry, dict(os.environ)).finish() == "made"
        if i == 1:  # the first one, oldest, used again: the second is now the least recent
            os.utime(store / keys[0], (1, 1))
            ask(entry, [*BASE, "-DKJ_N=0"], "used")
            assert pch.Precompiler(store, entry, dict(os.environ)).finish() == "used"
    assert {p.name for p in pch.variants(store)} == {keys[0], keys[2]}


def test_a_build_that_runs_out_of_time_stops_the_maker(
    fake_cxx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = tmp_path / "slow-cxx"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setenv("CXX", str(slow))
    store, entry = tmp_path / "store", tmp_path / "entry"
    ask(entry, BASE)
    maker = pch.Precompiler(store, entry, dict(os.environ))
    maker.poll()
    started = time.monotonic()
    assert maker.finish(time.monotonic() + 1.0) == "not made: it ran out of time"
    assert time.monotonic() - started < 10
    again = pch.Precompiler(store, entry, dict(os.environ))
    assert again.finish() == "not made: it failed within the last hour"
    assert not list((store / ".staging").iterdir())
    stopped = pch.Precompiler(store / "other", entry, dict(os.environ))
    stopped.poll()
    started = time.monotonic()
    assert stopped.finish(None) == "not made: it ran out of time"  # the build was killed
    assert time.monotonic() - started < 10


def test_one_maker_per_variant(fake_cxx: Path, tmp_path: Path) -> None:
    import fcntl

    store, entry = tmp_path / "store", tmp_path / "entry"
    ask(entry, BASE)
    (store / ".locks").mkdir(parents=True)
    key = pch_cxx.variant_key(BASE, pch.salt())
    with open(store / ".locks" / f"{key}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert pch.Precompiler(store, entry, dict(os.environ)).finish() == (
            "being made by another build"
        )
    assert pch.Precompiler(store, entry, dict(os.environ)).finish() == "made"


def test_a_build_cannot_write_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate's build-time code that writes into the shared store is refused, and its
    build rejected."""
    store = tmp_path / "pch"
    store.mkdir()
    monkeypatch.setenv("KERNELJUDGE_PCH_DIR", str(store))
    source = f"""
from pathlib import Path
Path({str(store / "poisoned")!r}).write_text("x")
from torch.utils.cpp_extension import load_inline
_ext = load_inline(name="kj_poison", cpp_sources="int f();", functions=["f"])
class ModelNew:
    pass
"""
    result = build(Candidate.from_source(source), cache=BuildCache(tmp_path / "c"), arch="9.0")
    assert not result.ok and result.rejected
    assert not (store / "poisoned").exists()


def test_the_switch_and_the_cache_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = BuildCache(tmp_path)
    cand = Candidate.from_source("import torch\nclass ModelNew(torch.nn.Module):\n    pass\n")
    on = cache.key(cand, "9.0")
    env = toolchain.build_environment("9.0", tmp_path / "ext", tmp_path / "pch")
    assert env["CXX"] == str(toolchain.PCH_WRAPPER) and env["KERNELJUDGE_PCH_DIR"]
    monkeypatch.setenv("KERNELJUDGE_PCH", "0")
    assert cache.key(cand, "9.0") != on  # a build made with it is not loaded without it
    assert "CXX" not in toolchain.build_environment("9.0", tmp_path / "ext", tmp_path / "pch")


CPP_TEMPLATE = '''
import torch
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
INCLUDE_LINE
#ifndef KJ_VALUE
#define KJ_VALUE 0
#endif
int64_t kj_value() { return KJ_VALUE; }
"""

_ext = load_inline(name="NAME", cpp_sources=cpp_source, functions=["kj_value"],
                   extra_cflags=FLAGS)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x
'''


def built_value(cache: BuildCache, source: str, name: str) -> tuple[int, dict[str, str]]:
    """Build ``source``, import its extension in a fresh interpreter and call ``kj_value``;
    returns the value and the requests the build's compile left."""
    result = build(Candidate.from_source(source, name=f"{name}.py"), cache=cache, arch="9.0")
    assert result.ok and not result.cached, result.log
    ext = cache.entry(result.cache_key) / "ext" / name
    asked = {p.name: json.loads(p.read_text())["state"] for p in ext.glob("*.pch.json")}
    return call_kj_value(ext, name), asked


def call_kj_value(ext: Path, name: str) -> int:
    """Import the extension ``name`` built in ``ext`` in a fresh interpreter (no GPU needed)
    and return what its ``kj_value`` returns."""
    code = (
        "import sys, torch, importlib.util as u; "
        f"s = u.spec_from_file_location({name!r}, {str(ext / (name + '.so'))!r}); "
        "m = u.module_from_spec(s); s.loader.exec_module(m); print(m.kj_value())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def candidate(name: str, flags: list[str], include: str = "") -> str:
    return (
        CPP_TEMPLATE.replace("NAME", name)
        .replace("FLAGS", repr(flags))
        .replace("INCLUDE_LINE", include)
    )


@pytest.mark.slow
def test_real_builds_honour_options_defines_includes_and_never_use_a_damaged_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the wrapper and a shared header, each build's own options, defines and includes
    make its binary (a changed flag, define or include rebuilds, and its value is its own); a
    damaged shared header is compiled without and made again."""
    monkeypatch.setenv("KERNELJUDGE_PCH_DIR", str(tmp_path / "pch"))  # its own, damaged below
    cache = BuildCache(tmp_path / "cache")
    first = built_value(cache, candidate("kj_pch_a", ["-O2"]), "kj_pch_a")
    assert first == (0, {"main.o.pch.json": "missing"})  # made beside this build
    # The next builds with those options use it.
    assert built_value(cache, candidate("kj_pch_b", ["-O2"]), "kj_pch_b") == (0, USED)
    included = candidate("kj_pch_c", ["-O2"], "#include <climits>\n#define KJ_VALUE CHAR_BIT")
    assert built_value(cache, included, "kj_pch_c") == (8, USED)
    defined = candidate("kj_pch_d", ["-O2", "-DKJ_VALUE=7"], "")
    assert built_value(cache, defined, "kj_pch_d") == (7, {"main.o.pch.json": "missing"})

    store = pch.store_dir(cache.root)
    folder = store / pch_cxx.variant_key([*first_flags(cache, "kj_pch_a")], pch.salt())
    assert pch_cxx.state_of(str(folder)) == "ready"
    gch = folder / pch_cxx.GCH
    gch.chmod(0o644)
    with open(gch, "r+b") as f:  # one byte in the middle of the file
        f.seek(gch.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert pch_cxx.state_of(str(folder)) == "damaged"
    # Compiled without it (it asked, saying why), and the header was made again.
    assert built_value(cache, candidate("kj_pch_e", ["-O2"]), "kj_pch_e") == (
        0,
        {"main.o.pch.json": "damaged"},
    )
    assert pch_cxx.state_of(str(folder)) == "ready"
    assert built_value(cache, candidate("kj_pch_f", ["-O2"]), "kj_pch_f") == (0, USED)


USED = {"main.o.pch.json": "used"}


def first_flags(cache: BuildCache, name: str) -> list[str]:
    """The variant options the compile of extension ``name`` asked for (its request)."""
    for request in cache.root.glob(f"builds/*/*/ext/{name}/main.o.pch.json"):
        flags: list[str] = json.loads(request.read_text())["flags"]
        return flags
    raise AssertionError(f"no request of {name}")
