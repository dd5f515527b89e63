"""Suites and candidate layouts: KernelBench level folders and run folders, and ours."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneljudge.errors import KernelJudgeError
from kerneljudge.suite.layout import find_candidates, load_suite

_PROBLEM = """import torch
import torch.nn as nn
{extra}

class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(4)]


def get_init_inputs():
    return []
"""


def _kernelbench(root: Path) -> Path:
    for level, names in (
        (1, ["1_Square_matrix_multiplication_", "2_ReLU", "10_Tanh"]),
        (2, ["1_Conv_Add"]),
    ):
        folder = root / "KernelBench" / f"level{level}"
        folder.mkdir(parents=True)
        for name in names:
            (folder / f"{name}.py").write_text(_PROBLEM.format(extra=""))
    return root / "KernelBench"


def test_a_kernelbench_level_folder_and_its_run_folder(tmp_path: Path) -> None:
    problems = load_suite([str(_kernelbench(tmp_path) / "level1")])
    assert [(p.name, p.level, p.number) for p in problems] == [
        ("1_Square_matrix_multiplication_", 1, 1),
        ("2_ReLU", 1, 2),
        ("10_Tanh", 1, 10),
    ]
    runs = tmp_path / "runs" / "my_run"
    runs.mkdir(parents=True)
    for name in (
        "level_1_problem_1_sample_0_kernel.py",
        "level_1_problem_1_sample_1_kernel.py",
        "level_1_problem_10_sample_0_kernel.py",
        "level_2_problem_1_sample_0_kernel.py",  # level 2 is not in this suite
        "notes.py",
    ):
        (runs / name).write_text("class ModelNew: pass\n")
    pairs, unmatched = find_candidates(runs, problems)
    assert [(p.problem.name, p.sample) for p in pairs] == [
        ("1_Square_matrix_multiplication_", "0"),
        ("1_Square_matrix_multiplication_", "1"),
        ("10_Tanh", "0"),
    ]
    assert sorted(p.name for p in unmatched) == [
        "level_2_problem_1_sample_0_kernel.py",
        "notes.py",
    ]
    # The whole benchmark (level folders under one root) matches level 2 as well.
    everything = load_suite([str(tmp_path / "KernelBench")])
    assert len(everything) == 4
    pairs, unmatched = find_candidates(runs, everything, layout="kernelbench")
    assert ("1_Conv_Add", "0") in [p.key for p in pairs]


def test_our_layout_folders_and_single_files(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "alpha.py").write_text(_PROBLEM.format(extra='TAGS = ["x", "y"]\nLEVEL = 3'))
    (suite / "beta.py").write_text(_PROBLEM.format(extra='NAME = "beta_named"'))
    problems = load_suite([str(suite)])
    assert [(p.name, p.level, p.tags) for p in problems] == [
        ("alpha", 3, ("x", "y")),
        ("beta_named", None, ()),
    ]
    cands = tmp_path / "cands"
    (cands / "alpha").mkdir(parents=True)
    for s in ("s10", "s2", "s1"):
        (cands / "alpha" / f"{s}.py").write_text("")
    (cands / "beta_named.py").write_text("")
    (cands / "gamma").mkdir()
    (cands / "gamma" / "0.py").write_text("")
    pairs, unmatched = find_candidates(cands, problems)
    assert [p.key for p in pairs] == [
        ("alpha", "s1"),
        ("alpha", "s2"),
        ("alpha", "s10"),
        ("beta_named", "0"),
    ]
    assert [p.name for p in unmatched] == ["0.py"]
    with pytest.raises(KernelJudgeError, match="both sample '0' of beta_named"):
        (cands / "beta_named").mkdir()
        (cands / "beta_named" / "0.py").write_text("")
        find_candidates(cands, problems)


def test_bundled_names_files_and_bad_specs(tmp_path: Path) -> None:
    problems = load_suite(["causal_gqa", "triangle_attention"])
    assert [p.name for p in problems] == ["causal_gqa", "triangle_attention"]
    assert "attention" in problems[0].tags
    assert len(load_suite(["bundled"])) >= 20
    with pytest.raises(KernelJudgeError, match="no problem named"):
        load_suite(["no_such_problem"])
    with pytest.raises(KernelJudgeError, match="candidates folder not found"):
        find_candidates(tmp_path / "missing", problems)
    with pytest.raises(KernelJudgeError, match="unknown layout"):
        find_candidates(tmp_path, problems, layout="mine")
    (tmp_path / "one.py").write_text("")
    with pytest.raises(KernelJudgeError, match="must be a folder .*, not the file .*one.py"):
        find_candidates(tmp_path / "one.py", problems)


@pytest.mark.parametrize(
    ("line", "field", "shown"),
    [
        ("NAME = 123", "NAME", "a non-empty string, not 123"),
        ('NAME = ""', "NAME", "a non-empty string, not ''"),
        ('LEVEL = "x"', "LEVEL", "an integer, not 'x'"),
        ("LEVEL = True", "LEVEL", "an integer, not True"),
        ('TAGS = "notalist"', "TAGS", "a list of strings, not 'notalist'"),
        ("TAGS = [1, 2]", "TAGS", "a list of strings, not [1, 2]"),
        ("NAME = make_name()", "NAME", "a literal (a suite reads it without running the file)"),
    ],
)
def test_a_problem_field_of_the_wrong_kind_is_an_error_naming_file_and_field(
    tmp_path: Path, line: str, field: str, shown: str
) -> None:
    path = tmp_path / "level3" / "p.py"
    path.parent.mkdir()
    path.write_text(f"{line}\n{_PROBLEM}")
    with pytest.raises(KernelJudgeError) as info:
        load_suite([str(path)])
    message = str(info.value)
    assert message.startswith(f"problem file {path}: {field} must be ") and shown in message
    assert "\n" not in message


def test_good_problem_fields_are_read_and_none_level_falls_back_to_the_folder(
    tmp_path: Path,
) -> None:
    path = tmp_path / "level3" / "p.py"
    path.parent.mkdir()
    path.write_text(f'NAME = "named"\nLEVEL = None\nTAGS = ("a", "b")\n{_PROBLEM}')
    (p,) = load_suite([str(path)])
    assert (p.name, p.level, p.tags) == ("named", 3, ("a", "b"))
    path.write_text(f"LEVEL: int = 7\n{_PROBLEM}")
    (p,) = load_suite([str(path)])
    assert (p.name, p.level, p.tags) == ("p", 7, ())
