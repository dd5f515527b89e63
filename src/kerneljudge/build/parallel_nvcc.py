"""nvcc with its host and device front ends run at the same time.

For one ``.cu`` file, nvcc runs its steps one after the other: the host preprocessor and
``cudafe++`` (the host front end), then the device preprocessor, ``cicc`` and ``ptxas`` (the
device front end and assembler), ``fatbinary``, and finally the host compiler on ``cudafe++``'s
output, which includes the device code. For a PyTorch extension each front end parses the whole
of ``torch/extension.h``, so each takes about a third of the build. The two branches depend on
each other only through the *module id* file that ``cudafe++`` writes and ``cicc`` reads (it
names the translation unit's anonymous namespace and registration symbols consistently on both
sides). This wrapper asks nvcc for its plan (``-dryrun``), writes a module id itself, runs the
two branches concurrently, then the host compile: on the H200 machine's host a CUDA extension
builds about a third faster. Outputs and diagnostics are nvcc's own: the host branch's messages
come first and a failed host branch hides the device branch's (duplicate) messages, as nvcc
would have stopped there; the dependency file (``-MD -MF``) comes from the host preprocessor.
The steps' messages all go to standard output.

Where the store of shared headers is set (``$KERNELJUDGE_PCH_DIR`` and
``$KERNELJUDGE_CUDA_PCH_SALT``) and the source opens as ``load_inline`` writes it, the module
id comes from the options (:func:`kerneljudge.build.pch_cuda.module_id`) and the host compile
goes through the variant's shared prefix when it fits (:mod:`kerneljudge.build.pch_cuda`).

When the plan is not of that shape (several source files, ``-E``, ``-ptx``, ``-dlink``, an
unknown step), the real nvcc runs unchanged. The real nvcc is ``$KERNELJUDGE_NVCC``, else the
first ``nvcc`` on ``PATH``.

It is a standalone script (standard library only), run by ninja in the build worker as
``python parallel_nvcc.py ARGS...``: torch's extension builder takes it from ``PYTORCH_NVCC``
(see :func:`kerneljudge.build.toolchain.build_environment`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

if __package__:
    from kerneljudge.build import pch_cuda
else:  # run as a script (no package import, so no torch import): the module lies beside it
    import pch_cuda  # type: ignore[no-redef,import-not-found]

__all__ = ["Plan", "main", "plan_of"]

_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_MODULE_ID = re.compile(r'--gen_module_id_file\s+--module_id_file_name\s+"([^"]+)"')


@dataclass(frozen=True)
class Plan:
    """nvcc's steps for one compile, split into what can run at once.

    Attributes:
        env: the variables nvcc sets for its steps (``PATH``, ``CICC_PATH``...).
        host: the host preprocessor and ``cudafe++`` (which no longer writes the module id).
        device: the device preprocessor, ``cicc``, ``ptxas`` per architecture, ``fatbinary``.
        tail: what needs both (the host compile of ``cudafe++``'s output).
        module_id_path: the module id file both front ends read.
    """

    env: dict[str, str]
    host: list[str]
    device: list[str]
    tail: list[str]
    module_id_path: str


def real_nvcc() -> str:
    """The real nvcc: ``$KERNELJUDGE_NVCC``, else the first ``nvcc`` on ``PATH``."""
    return os.environ.get("KERNELJUDGE_NVCC") or shutil.which("nvcc") or "nvcc"


def _split_depfile(args: list[str]) -> tuple[list[str], str | None]:
    """Take torch's dependency request, the consecutive ``-MD -MF FILE``, out of the
    arguments (a ``-MD`` meant for the host compiler, after ``-Xcompiler``, stays)."""
    for i in range(len(args) - 2):
        if args[i] == "-MD" and args[i + 1] == "-MF":
            return args[:i] + args[i + 3 :], args[i + 2]
    return list(args), None


def plan_of(dryrun: str, scratch: str) -> Plan | None:
    """Parse ``nvcc -dryrun``'s output (its ``#$`` lines) into a :class:`Plan`.

    Returns None when the steps are not one whole-file compile of the expected shape, or when a
    temporary file would fall outside ``scratch``.
    """
    lines = [ln[3:] for ln in dryrun.splitlines() if ln.startswith("#$ ")]
    env: dict[str, str] = {}
    commands: list[str] = []
    for ln in lines:
        m = _ASSIGNMENT.match(ln)
        if m and not commands:
            value = m.group(2).strip()
            if len(value) >= 2 and value[0] == value[-1] == '"' and value.count('"') == 2:
                value = value[1:-1]
            env[m.group(1)] = value
        elif ln.startswith("--") or not ln.strip():
            return None  # a step nvcc performs itself (e.g. filtering dependencies)
        else:
            commands.append(ln)
    try:
        tools = [os.path.basename(shlex.split(c)[0]) for c in commands]
    except (ValueError, IndexError):
        return None
    if tools.count("cudafe++") != 1 or tools.count("fatbinary") != 1 or "nvlink" in tools:
        return None
    front, fatbin = tools.index("cudafe++"), tools.index("fatbinary")
    m = _MODULE_ID.search(commands[front])
    if fatbin < front or m is None or not all(" -E " in c for c in commands[:front]):
        return None  # the host branch must be preprocessing only
    for c in commands:
        for path in re.findall(r"[^\s\"'=]*tmpxft_[^\s\"']*", c):
            if os.path.isabs(path) and not path.startswith(scratch + os.sep):
                return None
    host = commands[:front] + [commands[front].replace("--gen_module_id_file ", "", 1)]
    return Plan(
        env=env,
        host=host,
        device=commands[front + 1 : fatbin + 1],
        tail=commands[fatbin + 1 :],
        module_id_path=m.group(1),
    )


def _module_id(args: list[str], source: str) -> str:
    """A module id of nvcc's own shape, unique to this output and source text."""
    digest = hashlib.sha256("\0".join(args).encode())
    try:
        with open(source, "rb") as f:
            digest.update(f.read())
    except OSError:
        pass
    return pch_cuda.module_id_of(digest.hexdigest(), source)


class _SharedPrefix:
    """A compile's use of its variant's shared prefix (:mod:`kerneljudge.build.pch_cuda`):
    the store is checked in a thread while the front ends run, and ``OUTPUT.cuhost.json``
    records at once a ``missing`` or ``damaged`` variant for the supervisor to make; the host
    compile then goes through the prefix when it fits, and the record says ``used``,
    ``unmatched`` (another host command, or other bytes) or ``failed`` (compiled again
    without it)."""

    def __init__(self, flags: list[str], source: str, target: str, folder: str) -> None:
        self.flags, self.target, self.folder = flags, target, folder
        self.module_id = pch_cuda.module_id(flags, source)
        self._state: tuple[str, bytes, list[str]] = ("missing", b"", [])
        self._check = threading.Thread(target=self._look, daemon=True)
        self._check.start()

    @classmethod
    def of(cls, args: list[str], source: str, target: str) -> _SharedPrefix | None:
        """None unless the store and salt are set, the compile makes whole-program code, has
        an output and its source starts as :data:`kerneljudge.build.pch_cuda.CANONICAL`."""
        store = os.environ.get("KERNELJUDGE_PCH_DIR")
        salt = os.environ.get("KERNELJUDGE_CUDA_PCH_SALT")
        if os.environ.get("NVCC_APPEND_FLAGS") or os.environ.get("NVCC_PREPEND_FLAGS"):
            return None  # options nvcc takes from elsewhere than the command line
        flags = pch_cuda.variant_flags(args, source)
        if not (store and salt and target and pch_cuda.shareable(flags)):
            return None
        if not pch_cuda.starts_canonically(source):
            return None
        return cls(flags, source, target, os.path.join(store, pch_cuda.variant_key(flags, salt)))

    def _look(self) -> None:
        try:
            self._state = pch_cuda.state_of(self.folder)
        except Exception:  # noqa: BLE001 - the compile goes on without it
            self._state = ("damaged", b"", [])
        if self._state[0] != "ready":  # asked for now: it is made while the front ends run
            self._record(self._state[0])

    def compile_tail(
        self, commands: list[str], env: dict[str, str], sink: list[bytes]
    ) -> int | None:
        """Run the host compile through the prefix; None when it was not used or failed
        (the caller then runs the commands unchanged)."""
        self._check.join()
        state, prefix, tail = self._state
        if state != "ready":
            return None
        index = [i for i, c in enumerate(commands) if pch_cuda.tail_shape(c)]
        try:
            kept = (
                pch_cuda.with_prefix(commands[index[0]], self.folder, prefix, tail)
                if len(index) == 1
                else None
            )
        except Exception:  # noqa: BLE001 - compiled without it
            kept = None
        if kept is None:
            self._record("unmatched")
            return None
        code = _run(commands, env, sink)
        if code != 0:
            pch_cuda.swap_out(kept)  # compiled again from the original
            self._record("failed")
            return None
        self._record("used")
        return 0

    def _record(self, state: str) -> None:
        try:
            with open(self.target + ".cuhost.json", "w") as f:
                json.dump({"flags": self.flags, "state": state}, f)
        except OSError:
            pass


def _run(commands: list[str], env: dict[str, str], sink: list[bytes]) -> int:
    try:
        return _run_steps(commands, env, sink)
    except OSError as exc:
        sink.append(f"parallel_nvcc: {exc}\n".encode())
        return 1


def _run_steps(commands: list[str], env: dict[str, str], sink: list[bytes]) -> int:
    for command in commands:
        proc = subprocess.run(
            command,
            shell=True,
            executable="/bin/bash",
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        if command.startswith("rm "):
            continue  # nvcc's own clean-up, which may find nothing to remove
        sink.append(proc.stdout)
        if proc.returncode != 0:
            return proc.returncode
    return 0


def _source_of(args: list[str]) -> str | None:
    sources = [a for a in args if a.endswith((".cu", ".cup")) and not a.startswith("-")]
    return sources[0] if len(sources) == 1 else None


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    nvcc = real_nvcc()
    compile_args, depfile = _split_depfile(args)
    source = _source_of(compile_args)
    if source is None or "-c" not in compile_args or "-dryrun" in compile_args:
        return subprocess.call([nvcc, *args])
    scratch = os.path.realpath(tempfile.mkdtemp(prefix="kj-nvcc-"))
    try:
        env = dict(os.environ, TMPDIR=scratch)
        dry = subprocess.run(
            [nvcc, *compile_args, "-dryrun"], env=env, capture_output=True, text=True
        )
        plan = plan_of(dry.stdout + dry.stderr, scratch) if dry.returncode == 0 else None
        if plan is None:
            return subprocess.call([nvcc, *args])
        notes = [
            ln for ln in (dry.stdout + dry.stderr).splitlines() if ln.strip() and ln[:2] != "#$"
        ]
        if notes:  # nvcc's own warnings about the arguments
            print("\n".join(notes), file=sys.stderr, flush=True)
        target = compile_args[compile_args.index("-o") + 1] if "-o" in compile_args else ""
        if depfile:  # the host preprocessor lists every header, as nvcc's own would
            first = plan.host[0]
            plan.host[0] = f"{first} -MD -MF {shlex.quote(depfile)} -MT {shlex.quote(target)}"
        try:
            shared = _SharedPrefix.of(compile_args, source, target)
        except Exception:  # noqa: BLE001 - the compile runs as before
            shared = None
        with open(plan.module_id_path, "w") as f:
            f.write(shared.module_id if shared else _module_id(compile_args, source))
        env.update(plan.env)
        host_out: list[bytes] = []
        device_out: list[bytes] = []
        codes: dict[str, int] = {}
        device = threading.Thread(
            target=lambda: codes.__setitem__("device", _run(plan.device, env, device_out))
        )
        device.start()
        codes["host"] = _run(plan.host, env, host_out)
        device.join()
        out = sys.stdout.buffer
        out.write(b"".join(host_out))
        if codes["host"] != 0:
            out.flush()
            return codes["host"]
        out.write(b"".join(device_out))
        out.flush()
        if codes.get("device", 1) != 0:
            return codes.get("device", 1)
        tail_out: list[bytes] = []
        code = shared.compile_tail(plan.tail, env, tail_out) if shared else None
        if code is None:
            tail_out.clear()
            code = _run(plan.tail, env, tail_out)
        out.write(b"".join(tail_out))
        out.flush()
        if code == 0 and depfile and not os.path.exists(depfile):
            with open(depfile, "w") as f:
                f.write(f"{target}: {source}\n")
        return code
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
