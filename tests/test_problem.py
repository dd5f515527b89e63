"""Problem loading, metadata, shape sets and seeded inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kerneljudge.errors import ProblemError
from kerneljudge.problem import Problem, bundled_problem_names

TINY = Path(__file__).parent / "fixtures" / "tiny_problem.py"


def test_bundled_seed_problems_load_by_name() -> None:
    names = bundled_problem_names()
    for name in ("causal_gqa", "mla_kv_projection", "triangle_attention"):
        assert name in names
        p = Problem.load(name)
        assert p.name == name and "public" in p.shape_sets and p.heldout_shape_sets
        assert p.flop_count() and p.flop_count() > 0


def test_unknown_and_missing_problems_raise_one_line() -> None:
    with pytest.raises(ProblemError, match="no problem named 'nope'"):
        Problem.load("nope")
    with pytest.raises(ProblemError, match="not found"):
        Problem.load("/no/such/problem.py")


def test_broken_problem_files(tmp_path: Path) -> None:
    f = tmp_path / "p.py"
    f.write_text("def get_inputs(): return []\n")
    with pytest.raises(ProblemError, match="must define Model"):
        Problem.load(f)
    f.write_text("class Model(:\n")
    with pytest.raises(ProblemError, match="syntax error"):
        Problem.load(f)
    f.write_text("import nonexistent_module_xyz\n")
    with pytest.raises(ProblemError, match="failed to import"):
        Problem.load(f)


def test_shape_sets_patch_globals_and_inputs_are_seeded() -> None:
    p = Problem.load(TINY)
    assert p.make_inputs(1)[0].shape == (64, 32)
    a, b = p.make_inputs(7), p.make_inputs(7)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], p.make_inputs(8)[0])
    p.use_shape_set("heldout")
    assert p.make_inputs(1)[0].shape == (48, 32)
    p.use_shape_set("public")
    assert p.make_inputs(1)[0].shape == (64, 32)
    with pytest.raises(ProblemError, match="no shape set"):
        p.use_shape_set("huge")


def test_model_weights_follow_the_seed() -> None:
    p = Problem.load(TINY)
    w1 = p.make_model(3).lin.weight
    assert torch.equal(w1, p.make_model(3).lin.weight)
    assert not torch.equal(w1, p.make_model(4).lin.weight)
    assert not p.make_model(3).training


def test_integer_inputs_keep_their_dtype(tmp_path: Path) -> None:
    f = tmp_path / "emb.py"
    f.write_text(
        "import torch\nclass Model(torch.nn.Module):\n"
        "    def forward(self, ids): return ids * 2\n"
        "def get_inputs(): return [torch.randint(0, 10, (5,))]\n"
        "def get_init_inputs(): return []\n"
    )
    (ids,) = Problem.load(f).make_inputs(0)
    assert ids.dtype == torch.int64


def test_tolerance_defaults_and_override(tmp_path: Path) -> None:
    assert Problem.load(TINY).tolerance == (1e-4, 1e-4)
    f = tmp_path / "bf.py"
    f.write_text(TINY.read_text() + "\nDTYPE = 'bfloat16'\n")
    assert Problem.load(f).tolerance == (1e-2, 1e-2)
    f.write_text(TINY.read_text() + "\nTOLERANCE = {'atol': 1e-3}\n")
    assert Problem.load(f).tolerance == (1e-3, 1e-4)
