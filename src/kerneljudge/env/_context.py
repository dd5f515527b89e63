"""What the tools act on: the judge with per-tool settings, and the environment's reward."""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, Union

import torch

from kerneljudge.candidate import Candidate
from kerneljudge.device import resolve_device
from kerneljudge.env._tool import ToolError
from kerneljudge.env.config import EnvConfig
from kerneljudge.errors import DeviceError, KernelJudgeError
from kerneljudge.judge import Judge, JudgeConfig
from kerneljudge.problem import Problem
from kerneljudge.verdict import BuildResult, DeviceInfo, Verdict
from kerneljudge.worker import CandidateFault, WorkerDied, WorkerTimeout

if TYPE_CHECKING:
    from kerneljudge.env.remote import RemoteSession

__all__ = ["JudgeSession", "ToolContext", "resolve_env_device"]

T = TypeVar("T")


def resolve_env_device(device: str) -> str:
    """``auto`` becomes ``cuda`` when a GPU is visible, else ``cpu``; others pass through."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class JudgeSession:
    """One judge, driven with the settings each tool needs.

    Builds run outside ``device_lock``; everything that runs a candidate holds it, so that
    episodes sharing a device (the runner's ``--concurrency``) never time on top of each other.

    Args:
        problem: the problem.
        config: the environment's configuration.
        judge: a judge to use (it stays open on :meth:`close`); None: a new one, owned.
        device_lock: a lock shared by everything that runs on the same device (None: a
            private one).
    """

    def __init__(
        self,
        problem: Problem,
        config: EnvConfig,
        judge: Judge | None = None,
        device_lock: Any = None,
    ) -> None:
        self.config = config
        self.device = resolve_env_device(config.device)
        self._owns_judge = judge is None
        self.judge = judge or Judge(
            problem,
            JudgeConfig(
                device=self.device,
                tolerance=config.tolerance,
                build_timeout_s=config.build_timeout_s,
                run_timeout_s=config.run_timeout_s,
                cache_dir=config.cache_dir,  # type: ignore[arg-type]
                threads=config.threads,
            ),
        )
        self.lock = device_lock if device_lock is not None else threading.Lock()
        # What the judge prepares between calls (the next verdict's reference work) waits for
        # this lock too, so it never runs beside another episode's timing.
        self.judge.device_lock = self.lock

    @property
    def problem(self) -> Problem:
        return self.judge.problem

    def device_info(self) -> DeviceInfo:
        """The device candidates run on."""
        return self.judge.device_info(_torch_device(self.device))

    def close(self) -> None:
        """End the judge's workers when this session created the judge."""
        if self._owns_judge:
            self.judge.close()

    # ------------------------------------------------------------------ per-tool settings
    def _settings(self, **changes: Any) -> Any:
        return self.judge.configured(device=self.device, tolerance=self.config.tolerance, **changes)

    def usable(self, cand: Candidate) -> None:
        """Check that the candidate can run on this environment's device, before any build.

        Raises:
            DeviceError: a cuda/triton candidate on a CPU environment, or no such GPU.
        """
        resolve_device(self.device, cand.needs_gpu)

    def build(self, cand: Candidate) -> BuildResult:
        """Compile only (cached by content).

        Raises:
            DeviceError: see :meth:`usable`.
        """
        self.usable(cand)
        return self.judge.build(cand, _torch_device(self.device))

    def check(self, cand: Candidate) -> Verdict:
        """``run_correctness``: the public shapes, ``trials`` trials, no timing."""
        self.build(cand)
        settings = self._settings(trials=self.config.trials, shape_sets=("public",), timing=False)
        with self.lock, settings:
            return self.judge.evaluate(cand)

    def benchmark(self, cand: Candidate) -> Verdict:
        """``run_benchmark``: one trial, then timing against the configured baselines."""
        self.build(cand)
        timing = dataclasses.replace(
            self.judge.config.timing_config, max_time_s=self.config.benchmark_time_s
        )
        with (
            self.lock,
            self._settings(
                trials=1,
                shape_sets=("public",),
                timing=True,
                baselines=self.config.baselines,
                graph_timing=self.config.graph_timing,
                timing_config=timing,
            ),
        ):
            return self.judge.evaluate(cand)

    def profile(self, cand: Candidate) -> tuple[list[dict[str, Any]], str]:
        """The candidate's kernels (or CPU operators) and their shares; ``(rows, note)``.

        Never raises for a failure of the profiler or of the candidate under it: the note says
        what went wrong and the rows are empty.
        """
        self.usable(cand)
        try:
            with self.lock, self._settings(shape_sets=("public",)):
                rows = self.judge.profile(cand, calls=self.config.profile_calls)
        except CandidateFault as exc:
            return [], f"the candidate failed under the profiler: {_first_line(str(exc))}"
        except (WorkerDied, WorkerTimeout) as exc:
            return [], f"the profiled worker failed: {exc}"
        except KernelJudgeError as exc:
            return [], _first_line(str(exc))
        return _mark_own(rows, cand.source), ""

    def submit(self, cand: Candidate) -> Verdict:
        """``submit_kernel``: every shape set, ``submit_trials`` trials, fresh secret seeds."""
        self.build(cand)
        sets = self.config.submit_shape_sets or tuple(self.problem.shape_sets) or ("public",)
        timing = dataclasses.replace(
            self.judge.config.timing_config, max_time_s=self.config.submit_time_s
        )
        with (
            self.lock,
            self._settings(
                trials=self.config.submit_trials,
                shape_sets=tuple(sets),
                timing=True,
                baselines=self.config.baselines,
                graph_timing=self.config.graph_timing,
                timing_config=timing,
                seed=None,
            ),
        ):
            return self.judge.evaluate(cand)


def _torch_device(device: str) -> str:
    return "cuda:0" if device == "cuda" else device


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def _kernel_names(source: str) -> set[str]:
    """Names of the GPU kernels a candidate defines (CUDA ``__global__``, ``@triton.jit``)."""
    source = re.sub(r"__launch_bounds__\s*\([^)]*\)", " ", source)
    names = set(re.findall(r"__global__\s+(?:[\w:<>,\s*&]+?\s+)?(\w+)\s*\(", source))
    names |= set(
        re.findall(r"@triton\.(?:jit|autotune)[^\n]*\n(?:@[^\n]*\n)*\s*def\s+(\w+)", source)
    )
    return names


def _mark_own(rows: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """Flag the rows whose kernel the candidate defines itself (``own``)."""
    names = _kernel_names(source)
    out = []
    for row in rows:
        bare = str(row["name"]).removeprefix("void ").split("(")[0].split("<")[0].split("::")[-1]
        out.append({**row, "own": bare in names or row["name"] == "ModelNew.forward"})
    return out


class ToolContext:
    """Handed to the tool factories: the judge session and the environment's reward function.

    Args:
        session: the judge session: local (:class:`JudgeSession`) or through the judge
            service (:class:`~kerneljudge.env.remote.RemoteSession`, the same methods).
        reward: ``reward(verdict) -> float``, the environment's reward of a submitted verdict.
    """

    def __init__(
        self,
        session: Union[JudgeSession, RemoteSession],
        reward: Callable[[Verdict | None], float],
    ) -> None:
        self.session = session
        self._reward = reward

    def candidate(self, tool: str, kernel_code: str) -> Candidate:
        """The model's code as a candidate.

        Raises:
            ToolError: the code is empty.
        """
        if not kernel_code.strip():
            raise ToolError(
                tool, "kernel_code is empty; pass your complete Python file defining ModelNew"
            )
        return Candidate.from_source(kernel_code, name="kernel_code")

    def reward(self, verdict: Verdict | None) -> float:
        """The environment's reward of a submitted verdict."""
        return float(self._reward(verdict))

    def run(self, tool: str, fn: Callable[[Candidate], T], cand: Candidate) -> T:
        """Call a session method; a device the candidate cannot use becomes a tool error.

        Raises:
            ToolError: the candidate needs a GPU on a CPU-only environment (or the reverse);
                it carries the candidate's code.
        """
        try:
            return fn(cand)
        except DeviceError:
            raise ToolError(tool, _device_message(cand, self.session.device), cand.source) from None


def _device_message(cand: Candidate, device: str) -> str:
    if cand.needs_gpu:
        return (
            f"your code is a {cand.backend} candidate, which needs a CUDA GPU, but this "
            f"environment runs on the CPU: write C++ for load_inline (cpp_sources only) or plain "
            f"PyTorch instead"
        )
    return f"the device {device!r} is not available here"
