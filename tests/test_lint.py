from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_finds_no_problems():
    ruff = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    if not os.path.exists(ruff):
        pytest.skip("ruff is not installed (it comes with the test extra)")
    proc = subprocess.run([ruff, "check", "."], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_crl_envs_never_imports_crl_agent_or_eval():
    code = "import sys, crl_envs, crl_envs.testing, crl_envs.registry; " \
           "bad = [m for m in sys.modules if m.split('.')[0] in ('crl_agent', 'eval')]; print(bad); assert not bad"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True)


def _import_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Every module of ``packages`` and the project modules it imports, at module level or inside a
    function (``if TYPE_CHECKING`` blocks too): an edge to the deepest module the import names."""
    import ast
    from pathlib import Path

    files = {}
    for pkg in packages:
        for path in Path(REPO, pkg).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def module_of(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(module_of(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = ".".join([*package[:len(package) - node.level + 1], *([node.module] if node.module else [])]) \
                    if node.level else node.module
                # `from pkg import name` imports the module pkg.name where there is one, else pkg
                targets.update(module_of(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base) for a in node.names)
        graph[mod] = targets - {None, mod}
    return graph


def test_no_import_circle_in_the_project_packages():
    graph = _import_graph(("crl_envs", "crl_agent", "eval"))
    done: set[str] = set()
    path: list[str] = []

    def visit(mod: str) -> None:  # depth-first: a module met again on the current path closes a circle
        if mod in path:
            pytest.fail("import circle: " + " -> ".join([*path[path.index(mod):], mod]))
        if mod in done:
            return
        path.append(mod)
        for target in sorted(graph[mod]):
            visit(target)
        path.pop()
        done.add(mod)

    for mod in sorted(graph):
        visit(mod)


def test_the_import_circle_check_sees_function_level_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "circ"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circ.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from circ import a\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
    assert _import_graph(("circ",)) == {"circ": set(), "circ.a": {"circ.b"}, "circ.b": {"circ.a"}}
