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

When the plan is not of that shape (several source files, ``-E``, ``-ptx``, ``-dlink``, an
unknown step), the real nvcc runs unchanged. The real nvcc is ``$KERNELJUDGE_NVCC``, else the
first ``nvcc`` on ``PATH``.

It is a standalone script (standard library only), run by ninja in the build worker as
``python parallel_nvcc.py ARGS...``: torch's extension builder takes it from ``PYTORCH_NVCC``
(see :func:`kerneljudge.build.toolchain.build_environment`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

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


def _real_nvcc() -> str:
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
    h = digest.hexdigest()
    stem = re.sub(r"[^A-Za-z0-9]", "_", os.path.basename(source)) or "src"
    return f"_{h[:8]}_{len(stem)}_{stem}_{h[8:16]}"


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
    nvcc = _real_nvcc()
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
        with open(plan.module_id_path, "w") as f:
            f.write(_module_id(compile_args, source))
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
