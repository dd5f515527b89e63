"""The linter without false alarms: a scalar loss is no alarm for the mean null, and a reference
whose output shape follows no input (an off-by-one slice) is flagged."""

from __future__ import annotations

from pathlib import Path

from kerneljudge.lint import lint_problem
from kerneljudge.lint.shapes import check_output_shapes, traced_output_shapes
from kerneljudge.problem import Problem

FIXTURES = Path(__file__).parent / "fixtures"


def test_a_scalar_loss_passes_the_nulls_check() -> None:
    report = lint_problem(FIXTURES / "lint_scalar_loss.py")
    nulls = report.check("nulls_fail")
    assert nulls is not None and nulls.passed, nulls.detail
    assert report.check("output_shape").passed
    assert report.passed, [(c.name, c.detail) for c in report.failures]


def test_an_off_by_one_output_shape_is_flagged() -> None:
    report = lint_problem(FIXTURES / "lint_cumsum_off_by_one.py")
    shape = report.check("output_shape")
    assert shape is not None and not shape.passed and not report.passed
    assert "127, 199" in shape.detail and "off-by-one" in shape.detail


def test_a_declared_output_shape_is_checked_at_every_shape_set(tmp_path: Path) -> None:
    report = lint_problem(FIXTURES / "lint_cumsum_exclusive.py")
    assert report.check("output_shape").passed, report.check("output_shape").detail
    # The off-by-one reference, declaring the shape its description states: caught again.
    wrong = tmp_path / "declared_wrong.py"
    wrong.write_text(
        (FIXTURES / "lint_cumsum_off_by_one.py").read_text()
        + "\n\ndef output_shape(x):\n    return tuple(x)\n"
    )
    problem = Problem.load(wrong)
    passed, detail = check_output_shapes(problem, traced_output_shapes(problem))
    assert passed is False and "(8, 127)" in detail and "(8, 128)" in detail


def test_output_ranks_that_change_between_shape_sets_are_flagged(tmp_path: Path) -> None:
    path = tmp_path / "rank_changes.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\nn = 4\n"
        "SHAPE_SETS = {'public': {'n': 4}, 'heldout': {'n': 5}}\n"
        "class Model(nn.Module):\n    def forward(self, x):\n"
        "        return x.sum(0) if x.shape[0] == 5 else x\n"
        "def get_inputs():\n    return [torch.randn(n, 3)]\n"
        "def get_init_inputs():\n    return []\n"
    )
    problem = Problem.load(path)
    passed, detail = check_output_shapes(problem, traced_output_shapes(problem))
    assert passed is False and "rank of outputs changes" in detail


def test_output_dims_explained_by_products_and_constants_pass(tmp_path: Path) -> None:
    path = tmp_path / "reshape.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\nb = 2\nt = 6\n"
        "SHAPE_SETS = {'public': {'b': 2, 't': 6}, 'heldout': {'b': 3, 't': 10}}\n"
        "class Model(nn.Module):\n    def forward(self, x):\n"
        "        return torch.stack([x, -x]).reshape(2, -1, 4)\n"
        "def get_inputs():\n    return [torch.randn(b, t, 4)]\n"
        "def get_init_inputs():\n    return []\n"
    )
    problem = Problem.load(path)
    passed, detail = check_output_shapes(problem, traced_output_shapes(problem))
    assert passed is True, detail
