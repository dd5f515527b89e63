"""The tree stays what docs/architecture.md says: every package documented, no module over 500
lines (bundled problems aside), and no import cycle among the package's modules at import time."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kerneljudge"
DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _import_time_imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Modules of the package that ``path`` imports when it is imported: top-level ``import``
    and ``from`` statements (those inside functions run later, and ``TYPE_CHECKING`` blocks
    never), each with the packages it passes through, less its own enclosing packages."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def add(mod: str) -> None:
        parts = mod.split(".")
        for i in range(1, len(parts) + 1):
            m = ".".join(parts[:i])
            # Its own enclosing packages are already in sys.modules when it is imported.
            if m in known and m != name and not name.startswith(m + "."):
                found.add(m)

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                test = ast.unparse(node.test)
                if "TYPE_CHECKING" not in test:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")
                    base = base if is_pkg else base[:-1]
                    base = base[: len(base) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                add(mod)
                for alias in node.names:
                    add(f"{mod}.{alias.name}")

    visit(tree.body)
    return found


def test_no_module_is_over_500_lines() -> None:
    long = {
        name: n
        for name, path in _modules().items()
        if ".problems." not in name and (n := len(path.read_text().splitlines())) > 500
    }
    assert not long, long


def test_no_import_cycle_at_import_time() -> None:
    mods = _modules()
    graph = {name: _import_time_imports(path, name, set(mods)) for name, path in mods.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := dfs(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := dfs(node)):
            raise AssertionError(" -> ".join(cycle))


def test_every_package_is_in_the_architecture_page_with_a_docstring() -> None:
    text = DOC.read_text()
    for init in sorted(SRC.glob("*/__init__.py")):
        package = init.parent.name
        assert f"`{package}/`" in text, f"docs/architecture.md does not place {package}/"
        if package != "problems":
            assert ast.get_docstring(ast.parse(init.read_text())), f"{package}/ has no docstring"


def test_no_nested_function_calls_itself() -> None:
    """A nested function (or a lambda bound to a name) that names itself holds its own closure
    cell: a reference cycle, so what it captures lives until the cyclic collector runs. In a
    GPU worker that was a candidate's outputs (gigabytes of device memory) per trial, until the
    device ran out beside the other worker. Such walks are module functions given their state."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for outer in ast.walk(tree):
            if not isinstance(outer, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for inner in ast.walk(outer):
                if inner is outer:
                    continue
                if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef):
                    name, body = inner.name, inner
                elif (
                    isinstance(inner, ast.Assign)
                    and isinstance(inner.value, ast.Lambda)
                    and len(inner.targets) == 1
                    and isinstance(inner.targets[0], ast.Name)
                ):
                    name, body = inner.targets[0].id, inner.value
                else:
                    continue
                named = {n.id for n in ast.walk(body) if isinstance(n, ast.Name)}
                if name in named:
                    found.append(f"{path.relative_to(SRC)}:{inner.lineno} {name}")
    assert found == []
