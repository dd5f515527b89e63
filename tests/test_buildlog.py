"""Compiler-log shaping: parsing diagnostics and tracing generated lines back."""

from kerneljudge.build.log import map_generated_line, parse_diagnostics, shape_log
from kerneljudge.verdict import CompilerMessage

GCC = "/tmp/x/main.cpp:12:5: error: 'foo' was not declared in this scope"
NVCC = '/tmp/x/cuda.cu(7): error: identifier "bar" is undefined'
NVCC_CODE = '/tmp/x/cuda.cu(9): error #20-D: identifier "baz" is undefined'


def test_parse_gcc_and_nvcc() -> None:
    msgs = parse_diagnostics("\n".join(["junk", GCC, NVCC, NVCC_CODE, GCC]))
    assert [(m.file.split("/")[-1], m.line, m.severity) for m in msgs] == [
        ("main.cpp", 12, "error"),
        ("cuda.cu", 7, "error"),
        ("cuda.cu", 9, "error"),
    ]
    assert msgs[0].column == 5 and "foo" in msgs[0].message
    assert msgs[2].message == 'identifier "baz" is undefined'


def test_parse_linker_and_ptxas() -> None:
    msgs = parse_diagnostics(
        "ptxas error   : Entry function uses too much shared data\n"
        "main.o: undefined reference to `missing_fn()'"
    )
    assert len(msgs) == 2 and all(m.line is None for m in msgs)


def test_map_prefers_the_line_whose_neighbours_agree() -> None:
    generated = ["#include <x>", "int a = 0;", "x = 1;", "int b = 0;"]
    candidate = [
        "src = '''",
        "x = 1;",
        "'''",
        "other = '''",
        "int a = 0;",
        "x = 1;",
        "int b = 0;",
        "'''",
    ]
    assert map_generated_line(generated, 3, candidate) == 6
    assert map_generated_line(generated, 1, candidate) is None  # not in the candidate
    assert map_generated_line(generated, 99, candidate) is None


def test_shape_log_puts_errors_first_with_context() -> None:
    msg = CompilerMessage("/t/cuda.cu", 7, None, "error", "boom", candidate_line=2)
    log = shape_log([msg], "raw line 1\nraw line 2", "a\nb\nc", "cand.py")
    lines = log.splitlines()
    assert lines[0] == "cand.py:2: error: boom (cuda.cu:7)"
    assert ">    2 | b" in lines[2]
    assert lines[-1] == "raw line 2"
