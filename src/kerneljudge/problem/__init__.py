"""Problems: a PyTorch reference in the KernelBench file format, plus optional metadata.

A problem file is a Python module that defines

* ``class Model(nn.Module)``: the reference computation;
* ``get_inputs() -> list``: the forward inputs (tensors or Python scalars);
* ``get_init_inputs() -> list``: the constructor arguments.

Shape parameters are module-level globals (``batch_size = 16``) that ``get_inputs`` and
``get_init_inputs`` read when they are called. Optional metadata, all module-level:

* ``NAME: str`` (default: the file's stem), ``DESCRIPTION: str``, ``TAGS: list[str]``;
* ``DTYPE: str``: the dtype the problem is stated in (``"float32"``, ``"bfloat16"``, ``"float16"``);
  a candidate must compute at this precision or better;
* ``TOLERANCE: dict``: ``{"atol": float, "rtol": float}`` overriding the per-dtype defaults;
* ``SHAPE_SETS: dict[str, dict]``: named overrides of the shape globals. The set named
  ``"public"`` is shown in prompts; every other set is held out for full evaluations. Values that
  derive from shape globals must be computed inside ``get_inputs``/``get_init_inputs``, not at
  module level, so that an override reaches them;
* ``flop_count() -> float`` and ``byte_count() -> float``: the work of one forward call at the
  current shape globals, in floating-point operations and in the fewest bytes that must cross
  device memory. Without ``byte_count`` the sum of input and output sizes is used;
* ``POLICY: dict``: judging policy, e.g. ``{"require_custom_kernel": True}``.

Inputs are drawn from a seed: :meth:`Problem.make_inputs` seeds torch's CPU generator, calls
``get_inputs()`` and moves the result to the requested device, so the same seed gives the same
inputs on every machine; a judge's workers on a GPU draw inputs and weights there instead (the
same seed, the same values on the same kind of GPU: torch's random kernels size their launches
by the device).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kerneljudge.errors import ProblemError, not_a_file

if TYPE_CHECKING:
    from kerneljudge.worker.spares import Spares

__all__ = [
    "DEFAULT_TOLERANCES",
    "Problem",
    "bundled_problem_names",
    "bundled_problems_dir",
    "is_bundled",
    "probed_weight_bytes",
    "resolve_problem",
]

#: Per-dtype ``allclose`` defaults (atol = rtol), as the task prompts state them.
DEFAULT_TOLERANCES: dict[torch.dtype, float] = {
    torch.float32: 1e-4,
    torch.float64: 1e-7,
    torch.float16: 1e-2,
    torch.bfloat16: 1e-2,
}

_DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float64": torch.float64,
}


def bundled_problems_dir() -> Path:
    """The folder of the problems that ship with kerneljudge."""
    return Path(__file__).resolve().parents[1] / "problems"


def bundled_problem_names() -> list[str]:
    """Names of the bundled problems, sorted."""
    return sorted(p.stem for p in bundled_problems_dir().glob("*.py") if not p.name.startswith("_"))


def resolve_problem(spec: str | Path) -> Path:
    """Turn a problem name or a path into the path of a problem file.

    Raises:
        ProblemError: the path does not exist (or is a folder, or not a regular file) and no
            bundled problem has that name.
    """
    path = Path(spec)
    if path.suffix == ".py" or path.exists() or "/" in str(spec):
        if not path.is_file():
            raise ProblemError(not_a_file("problem", spec))
        return path.resolve()
    candidate = bundled_problems_dir() / f"{spec}.py"
    if candidate.is_file():
        return candidate
    names = ", ".join(bundled_problem_names())
    raise ProblemError(f"no problem named {spec!r} (bundled: {names})")


def _load_module(path: Path, source: str) -> types.ModuleType:
    """Execute ``source`` (the text of ``path``) as a new module and check its definitions."""
    name = f"kerneljudge_problem_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ProblemError(f"cannot load problem file {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)
    except SyntaxError as exc:
        raise ProblemError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from None
    except (Exception, SystemExit) as exc:  # the file is user input: any failure is a problem error
        raise ProblemError(f"{path}: failed to import: {type(exc).__name__}: {exc}") from None
    for required in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, required):
            raise ProblemError(f"{path}: a problem file must define {required}")
    return module


def is_bundled(path: Path) -> bool:
    """Whether ``path`` is one of the problems that ship with kerneljudge (trusted: not probed)."""
    return path.resolve().parent == bundled_problems_dir()


#: Problem files probed by this process. path -> (SHA-256 of the probed text, whether that
#: probe drew on the ``meta`` device only, the bytes of ``Model``'s state dict per shape set).
_PROBED: dict[Path, tuple[str, bool, dict[str, int]]] = {}


def probed_weight_bytes(problem: Problem, shape_set: str) -> int | None:
    """Bytes of the state dict of ``problem``'s ``Model`` at ``shape_set`` as this process's
    probe of its file constructed it (on the ``meta`` device or the CPU, the constructor's
    arguments drawn from seed 0); None when no probe of this text ran here or it did not
    construct that shape set."""
    done = _PROBED.get(problem.path)
    if done is None or done[0] != hashlib.sha256(problem.source.encode("utf-8")).hexdigest():
        return None
    return done[2].get(shape_set)


@dataclass
class Problem:
    """A loaded reference problem.

    Attributes:
        path: the problem file.
        source: its text.
        name: ``NAME`` or the file stem.
        module: the executed module; shape globals are patched on it by :meth:`use_shape_set`.
    """

    path: Path
    source: str
    name: str
    module: types.ModuleType
    shape_set: str = "public"
    _base_globals: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def load(
        cls,
        spec: str | Path,
        *,
        probe: bool | None = None,
        probe_timeout_s: float | None = None,
        probe_memory_bytes: int | None = None,
        gpu_judge: bool = False,
        spares: Spares | None = None,
    ) -> Problem:
        """Load a problem by bundled name or by path.

        A problem file is untrusted input: unless it is bundled, it is first run in a probe child
        under a time and a memory limit (:func:`kerneljudge.problem.probe.probe_problem`: import,
        metadata, ``get_init_inputs``, ``Model``, ``get_inputs`` and the first reference call of
        every shape set; with ``gpu_judge`` where CUDA is visible, ``Model`` and
        ``get_inputs`` on the ``meta`` device and no reference call; once per process and file
        content, a probe on the CPU serving either kind of load), then executed here from the
        same text, on every load.
        Here it must still run: its metadata (shape sets, dtype, tolerance, policy), and the inputs
        and weights :meth:`make_inputs` and :meth:`make_model` draw.

        Args:
            spec: a bundled problem name or a path.
            probe: run the probe first (None: for every problem that is not bundled; a worker
                that is itself the problem's process passes False).
            probe_timeout_s: the probe's limit (seconds; None: ``PROBE_TIMEOUT_S``).
            probe_memory_bytes: the probe's memory limit (None: its default).
            gpu_judge: the load is a GPU judge's, whose process draws no inputs and runs no
                forward (:mod:`kerneljudge.problem.probe`); False for every other use.
            spares: where the probe child is taken from (started ahead of need; None: it
                starts now).

        Raises:
            ProblemError: missing file, unknown name, a failure of the probe (one line naming
                the file and the step), an import failure or missing definitions.
        """
        path = resolve_problem(spec)
        try:
            raw = path.read_bytes()
            source = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ProblemError(f"cannot read problem file {path}: {exc}") from None
        digest = hashlib.sha256(raw).hexdigest()
        done = _PROBED.get(path)
        probed = done is not None and done[0] == digest and (gpu_judge or not done[1])
        if (probe if probe is not None else not is_bundled(path)) and not probed:
            from kerneljudge.problem.probe import PROBE_TIMEOUT_S, probe_problem

            ran, meta_only, weight_bytes = probe_problem(
                path,
                PROBE_TIMEOUT_S if probe_timeout_s is None else probe_timeout_s,
                probe_memory_bytes,
                gpu_judge,
                spares,
            )
            if ran != digest:
                raise ProblemError(f"{path}: the file changed while it was being loaded")
            _PROBED[path] = (digest, meta_only, weight_bytes)
        return cls._from_source(path, source)

    @classmethod
    def _from_source(cls, path: Path, source: str) -> Problem:
        module = _load_module(path, source)
        name = str(getattr(module, "NAME", path.stem))
        problem = cls(path=path, source=source, name=name, module=module)
        sets = problem.shape_sets
        if sets:
            keys = {k for s in sets.values() for k in s}
            missing = [k for k in keys if not hasattr(module, k)]
            if missing:
                raise ProblemError(f"{path}: SHAPE_SETS names unknown globals: {missing}")
            problem._base_globals = {k: getattr(module, k) for k in keys}
            if "public" in sets:
                problem.use_shape_set("public")
        return problem

    def fresh(self) -> Problem:
        """A new :class:`Problem` executed from this one's text (not read again, not probed
        again), with its own module and shape globals, at the ``public`` set.

        Raises:
            ProblemError: the text fails to execute this time.
        """
        return type(self)._from_source(self.path, self.source)

    # ----------------------------------------------------------------- metadata
    @property
    def description(self) -> str:
        return str(getattr(self.module, "DESCRIPTION", "")).strip()

    @property
    def tags(self) -> list[str]:
        return list(getattr(self.module, "TAGS", []))

    @property
    def dtype(self) -> torch.dtype:
        """The stated dtype (``DTYPE``), default float32.

        Raises:
            ProblemError: ``DTYPE`` names no known dtype.
        """
        raw = str(getattr(self.module, "DTYPE", "float32"))
        try:
            return _DTYPE_NAMES[raw]
        except KeyError:
            raise ProblemError(f"{self.path}: unknown DTYPE {raw!r}") from None

    @property
    def tolerance(self) -> tuple[float, float]:
        """``(atol, rtol)``: ``TOLERANCE``, else the default of :data:`DEFAULT_TOLERANCES`."""
        default = DEFAULT_TOLERANCES.get(self.dtype, 1e-4)
        tol = dict(getattr(self.module, "TOLERANCE", {}) or {})
        return float(tol.get("atol", default)), float(tol.get("rtol", default))

    @property
    def policy(self) -> dict[str, Any]:
        return dict(getattr(self.module, "POLICY", {}) or {})

    @property
    def roll_timed_inputs(self) -> bool:
        """Whether timed calls reorder or scale the inputs (``ROLL_TIMED_INPUTS``, default
        True; triangular, symmetric and sorted dimensions are found and kept in order either
        way, :mod:`kerneljudge.worker.perturbation`): False for a problem whose inputs have
        structure the judge cannot see, whose timed inputs are then nudged only."""
        return bool(getattr(self.module, "ROLL_TIMED_INPUTS", True))

    @property
    def shape_sets(self) -> dict[str, dict[str, Any]]:
        return dict(getattr(self.module, "SHAPE_SETS", {}) or {})

    @property
    def heldout_shape_sets(self) -> list[str]:
        return [k for k in self.shape_sets if k != "public"]

    def use_shape_set(self, name: str) -> None:
        """Patch the module's shape globals with the set ``name``.

        Raises:
            ProblemError: no such shape set.
        """
        sets = self.shape_sets
        if name not in sets:
            if not sets and name == "public":
                return
            raise ProblemError(f"{self.name}: no shape set {name!r} (has: {list(sets)})")
        for key, value in self._base_globals.items():
            setattr(self.module, key, value)
        for key, value in sets[name].items():
            setattr(self.module, key, value)
        self.shape_set = name

    def shape_globals(self) -> dict[str, Any]:
        """The current values of the shape globals named by any shape set."""
        return {k: getattr(self.module, k) for k in self._base_globals}

    # ----------------------------------------------------------------- inputs and models
    def make_init_inputs(self, seed: int) -> list[Any]:
        """Constructor arguments, drawn with torch's CPU generator seeded by ``seed``."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return list(self.module.get_init_inputs())

    def make_inputs(
        self, seed: int, device: torch.device | str = "cpu", on_device: bool = False
    ) -> list[Any]:
        """Forward inputs for one trial, drawn with torch's CPU generator seeded by ``seed``.

        Tensors keep the dtype ``get_inputs`` gives them (integer inputs stay integers) and are
        moved to ``device``; non-tensor inputs pass through unchanged.

        With ``on_device`` and a CUDA ``device``, ``get_inputs()`` runs with that device as
        torch's default device and its generator seeded by ``seed``: tensors its factory
        functions make (``torch.rand`` and the like) are drawn there, not on the host (a draw
        of gigabytes takes seconds with the CPU generator, milliseconds there). The same seed
        gives the same inputs on the same kind of device, not the values of the CPU draw. With
        ``on_device`` and the ``meta`` device, they are made there: shapes and dtypes, no data.

        Raises:
            whatever ``get_inputs`` raises (on the device: a draw that needs the host, such as
            an explicit CPU generator, raises there; the caller may draw on the CPU instead).
        """
        dev = torch.device(device)
        there = on_device and dev.type in ("cuda", "meta")
        default = dev if there else contextlib.nullcontext()
        with (
            torch.random.fork_rng(devices=_seeded_devices(dev if there else torch.device("cpu"))),
            default,
        ):
            torch.manual_seed(seed)
            raw = list(self.module.get_inputs())
        return [x.to(dev) if isinstance(x, torch.Tensor) else x for x in raw]

    def make_model(
        self, seed: int, init_inputs: list[Any] | None = None, device: str = "cpu"
    ) -> torch.nn.Module:
        """The reference ``Model``, parameters drawn from ``seed``, in ``eval()`` mode.

        ``device="cpu"``: constructed on the CPU, drawn with torch's CPU generator. A CUDA
        ``device``: constructed with it as torch's default device, so that its parameters are
        drawn there by that device's generator seeded by ``seed`` (a GiB of weights takes
        seconds with the CPU generator, which draws on one thread, and milliseconds there); the
        same seed gives the same weights on the same kind of device, not the values of the CPU
        draw. ``device="meta"``: its parameters are shapes without data.

        Raises:
            whatever the constructor raises (on a CUDA device: code that needs host tensors,
            such as an explicit CPU generator or ``.numpy()``, may raise there only).
        """
        if init_inputs is None:
            init_inputs = self.make_init_inputs(seed)
        dev = torch.device(device)
        where = dev if dev.type != "cpu" else contextlib.nullcontext()
        with torch.random.fork_rng(devices=_seeded_devices(dev)), where:
            torch.manual_seed(seed)
            model = self.module.Model(*init_inputs)
        return model.eval()

    def flop_count(self) -> float | None:
        """Floating-point operations of one forward call at the current shapes, or None."""
        fn = getattr(self.module, "flop_count", None)
        return float(fn()) if callable(fn) else None

    def byte_count(self, inputs: list[Any] | None = None, outputs: Any = None) -> float | None:
        """Fewest bytes one forward call moves through memory at the current shapes.

        ``byte_count()`` from the file when it defines one; otherwise the sum of the sizes of
        ``inputs`` and ``outputs`` (both required then), else None.
        """
        fn = getattr(self.module, "byte_count", None)
        if callable(fn):
            return float(fn())
        if inputs is None or outputs is None:
            return None
        total = 0
        for t in list(inputs) + list(_flatten(outputs)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
        return float(total)


def _seeded_devices(dev: torch.device) -> list[torch.device]:
    """The CUDA devices whose generators a draw for ``dev`` must give back as it found them:
    ``torch.manual_seed`` reseeds the current one (every one, once CUDA is initialised). The
    index is fixed here, so that a draw that changes the current device restores the one it
    seeded."""
    if dev.type == "cuda":
        return [
            torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
        ]
    if torch.cuda.is_initialized():
        return [torch.device("cuda", torch.cuda.current_device())]
    return []


def _flatten(outputs: Any) -> list[Any]:
    if isinstance(outputs, (tuple, list)):
        return [y for x in outputs for y in _flatten(x)]
    return [outputs]
