"""Two small real suite runs on the CPU for the HTML report's tests.

Three problems in two level folders (``relu`` and ``rownorm`` with FLOP and byte counts, so
their timed verdicts carry a roofline; ``scale`` without a FLOP count, so it is left off the
roofline), PyTorch-only candidates (no compiler), judged by the suite runner with a short
timing budget: correct, slower, wrong, crashing and unparsable candidates. Run ``a`` also gets
one more verdict stored with an agent episode's transcript, and one candidate whose source
tries to close the page's ``<pre>`` and run a script; run ``b`` has no candidate for ``scale``.
"""

from __future__ import annotations

from pathlib import Path

from kerneljudge.suite.runner import SuiteOptions, run_pairs, start_run
from kerneljudge.suite.store import ResultsStore

_PROBLEM = """import torch
import torch.nn as nn

TAGS = {tags!r}
N, D = 16, 4096


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return {expr}


def get_inputs():
    return [torch.randn(N, D)]


def get_init_inputs():
    return []
{counts}"""

_COUNTS = """

def flop_count():
    return {flops} * N * D


def byte_count():
    return 2 * 4 * N * D
"""

PROBLEMS = {
    # name: (level folder, tags, reference expression, FLOPs per element or None)
    "relu": ("level1", ["elementwise"], "torch.relu(x)", 1),
    "scale": ("level1", ["elementwise", "scaling"], "x * 2.0", None),
    "rownorm": ("level2", ["reduction"], "x / x.norm(dim=-1, keepdim=True)", 3),
}

#: A candidate whose source tries to end the page's <pre> and run a script.
SCRIPT_IN_SOURCE = "</pre><script>window.__pwned = 1</script><pre>"

_CANDIDATE = """import torch
import torch.nn as nn

# {comment}


class ModelNew(nn.Module):
    def forward(self, x):
        return {expr}
"""

RUN_A = {
    ("relu", "same"): ("torch.relu(x)", "correct"),
    ("relu", "slow"): ("torch.relu(x.exp().log() + (x - x.exp().log()))", "correct"),
    ("relu", "wrong"): ("x.abs()", "incorrect"),
    ("scale", "same"): ("x * 2.0", "correct"),
    ("scale", "crash"): ("x[None].reshape(-1, 7)", "runtime_error"),
    ("scale", "syntax"): ("x *", "compile_error"),
    ("rownorm", "same"): ("x / x.norm(dim=-1, keepdim=True)", "correct"),
}
RUN_B = {
    ("relu", "same"): ("torch.relu(x)", "correct"),
    ("rownorm", "wrong"): ("x / x.norm(dim=0, keepdim=True)", "incorrect"),
}

#: The episode candidate stored in run ``a`` with its transcript (problem, sample).
EPISODE = ("rownorm", "episode")


def _write_suite(root: Path) -> Path:
    suite = root / "suite"
    for name, (level, tags, expr, flops) in PROBLEMS.items():
        folder = suite / level
        folder.mkdir(parents=True, exist_ok=True)
        counts = _COUNTS.format(flops=flops) if flops else ""
        text = _PROBLEM.format(tags=tags, expr=expr, counts=counts)
        (folder / f"{name}.py").write_text(text)
    return suite


def _write_candidates(root: Path, pairs: dict[tuple[str, str], tuple[str, str]]) -> Path:
    for (problem, sample), (expr, _) in pairs.items():
        folder = root / problem
        folder.mkdir(parents=True, exist_ok=True)
        comment = SCRIPT_IN_SOURCE if (problem, sample) == ("relu", "same") else sample
        (folder / f"{sample}.py").write_text(_CANDIDATE.format(comment=comment, expr=expr))
    return root


def transcript(source: str) -> list[dict[str, object]]:
    """An episode's records in the transcript format of :mod:`kerneljudge.agent.transcript`."""
    import json

    return [
        {"type": "episode", "transcript_version": "1.0", "problem": "rownorm", "model": "m",
         "episode_id": "ep-1", "t": 0.0},
        {"type": "message", "role": "system", "content": "Write ModelNew for rownorm.", "t": 0.0},
        {"type": "message", "role": "user", "content": "Make it fast <b>please</b>.", "t": 0.1},
        {"type": "assistant", "turn": 1, "content": "I will submit this.", "reasoning": None,
         "tool_calls": [{"id": "c1", "name": "submit_kernel",
                         "arguments": json.dumps({"kernel_code": source})}], "t": 1.0},
        {"type": "tool", "turn": 1, "call_id": "c1", "name": "submit_kernel",
         "arguments": json.dumps({"kernel_code": source}), "observation": "correct: 5/5",
         "outcome": "ok", "error": None, "done": True, "reward": 1.0, "duration_s": 2.5,
         "t": 3.5},
        {"type": "summary", "stop_reason": "submitted", "turns": 1, "t": 3.6},
    ]  # fmt: skip


def make_runs(root: Path, cache: Path) -> Path:
    """Judge runs ``a`` and ``b`` into ``root/results.db`` and return the store's path."""
    suite = _write_suite(root)
    db = root / "results.db"
    options = SuiteOptions(device="cpu", trials=2, max_time_s=0.3, cache_dir=str(cache))
    with ResultsStore(db) as store:
        for run_id, pairs in (("a", RUN_A), ("b", RUN_B)):
            cands = _write_candidates(root / f"cands-{run_id}", pairs)
            start_run(
                store,
                suite=[str(suite)],
                candidates=cands,
                options=options,
                run_id=run_id,
                model=f"model-{run_id}",
                sampling={"temperature": 0.0},
            )
            run_pairs(store, run_id)
        # The episode submitted rownorm/same's code: store that real verdict once more, as
        # the episode's, with the transcript.
        (row,) = [r for r in store.verdicts("a") if (r.problem, r.sample) == ("rownorm", "same")]
        store.add_verdict(
            "a",
            problem=EPISODE[0],
            sample=EPISODE[1],
            source=row.candidate_source,
            verdict=row.verdict,
            level=row.level,
            tags=row.tags,
            transcript=transcript(row.candidate_source),
            summary={"stop_reason": "submitted"},
        )
    return db
