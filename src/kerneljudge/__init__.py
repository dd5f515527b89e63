"""kerneljudge: a judge and agent environment for custom GPU kernels.

Build a candidate ``ModelNew``, check it against its PyTorch reference ``Model`` and time both
side by side::

    from kerneljudge import judge
    verdict = judge("causal_gqa", "my_kernel.py")
    print(verdict.status, verdict.timing.speedup("eager").median)
"""

from kerneljudge.candidate import Candidate, detect_backend
from kerneljudge.errors import (
    CandidateError,
    DeviceError,
    KernelJudgeError,
    ProblemError,
    WorkerError,
)
from kerneljudge.judge import Judge, JudgeConfig, judge
from kerneljudge.problem import Problem, bundled_problem_names
from kerneljudge.timing import TimingConfig
from kerneljudge.verdict import SCHEMA_VERSION, Status, Verdict

__version__ = "0.1.0"

__all__ = [
    "SCHEMA_VERSION",
    "Candidate",
    "CandidateError",
    "DeviceError",
    "Judge",
    "JudgeConfig",
    "KernelJudgeError",
    "Problem",
    "ProblemError",
    "Status",
    "TimingConfig",
    "Verdict",
    "WorkerError",
    "bundled_problem_names",
    "detect_backend",
    "judge",
]
