"""What the integrations share: options as an EnvConfig, and one line when a package is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kerneljudge.integrations._common import env_config, problem_list

SRC = Path(__file__).resolve().parents[2] / "src"


def test_options_become_an_env_config() -> None:
    config = env_config(
        device="cpu", baselines="eager", submit_shape_sets=["public"], max_tool_calls=3, trials=None
    )
    assert config.device == "cpu" and config.baselines == ("eager",)
    assert config.submit_shape_sets == ("public",) and config.max_tool_calls == 3
    assert config.trials == 5  # None keeps the default


def test_unknown_or_refused_options_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match="unknown option.*max_calls"):
        env_config(max_calls=3)
    with pytest.raises(ValueError, match="unknown baselines"):
        env_config(baselines="eager,fast")
    with pytest.raises(ValueError, match="no problem"):
        problem_list(" , ")
    assert problem_list("causal_gqa, triangle_attention") == ["causal_gqa", "triangle_attention"]


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [("verifiers", "verifiers", "verifiers"), ("inspect", "inspect_ai", "inspect")],
)
def test_a_missing_package_names_its_extra(module: str, blocked: str, extra: str) -> None:
    code = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        "try:\n"
        f"    import kerneljudge.integrations.{module}\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("MissingExtraError the ")
    assert out.stdout.strip().endswith(f"is missing: install kerneljudge[{extra}]")
