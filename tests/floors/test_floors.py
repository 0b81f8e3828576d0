"""The house has floors: a package imports only packages below it (import-linter's layers
contract in pyproject.toml, the same command CI could run: `lint-imports`), and no module
reaches into another module's private names, and no two files import each other, directly or
round a longer circle (strongly connected components of grimp's module graph, the one
import-linter builds)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gameday", "operations", "provisioning", "chaos", "environments", "loadtests",
            "platforms", "slo", "controlplane")
LINT = str(Path(sys.executable).with_name("lint-imports"))
# private names of the standard library / third parties used on purpose, with the reason
ALLOWED_PRIVATE = {("os", "_exit")}  # the workload exits at once when its agent died


def _lint(config: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = [LINT, "--no-cache"] + (["--config", str(config)] if config else [])
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False,
                          timeout=300)


def test_no_package_imports_a_package_above_it() -> None:
    r = _lint()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "1 kept, 0 broken" in r.stdout


def test_the_layers_contract_can_fail(tmp_path: Path) -> None:
    # the same packages with the floors upside down: every real import then points "up"
    config = tmp_path / "upside-down.toml"
    config.write_text(
        '[tool.importlinter]\nroot_packages = ["gameday", "slo", "platforms"]\n\n'
        '[[tool.importlinter.contracts]]\nname = "upside down"\ntype = "layers"\n'
        'layers = ["slo", "platforms", "gameday"]\n')
    r = _lint(config)
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout[-2000:]


def private_uses(path: Path) -> list[str]:
    """``name._private`` where ``name`` is not self/cls, and ``from module import _private``:
    reaching into another module's or object's internals."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out += [f"{path}:{node.lineno}: from {node.module} import {a.name}"
                    for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.attr.startswith("_") and not node.attr.startswith("__")
              and node.value.id not in ("self", "cls")
              and (node.value.id, node.attr) not in ALLOWED_PRIVATE):
            out.append(f"{path}:{node.lineno}: {node.value.id}.{node.attr}")
    return out


def test_no_module_uses_another_modules_private_names() -> None:
    found = [u for pkg in PACKAGES for f in sorted((ROOT / pkg).rglob("*.py"))
             for u in private_uses(f)]
    assert found == []


def test_the_private_name_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from environments.local import faults\nfrom x import _y\n"
                   "def f(inj):\n    return inj._begin('kill', 'api-1', {})\n")
    assert [u.split(": ", 1)[1] for u in private_uses(bad)] == ["from x import _y", "inj._begin"]


def import_circles(*packages: str) -> list[list[str]]:
    """Groups of modules that import each other round a circle (Tarjan's strongly connected
    components with more than one module), every import counted, lazy ones too."""
    graph = grimp.build_graph(*packages)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, 0)]  # iterative: the house is deeper than the recursion limit allows
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            children = edges.get(node, [])
            if i < len(children):
                work.append((node, i + 1))
                child = children[i]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return groups


def test_no_file_import_circle_in_the_house() -> None:
    assert import_circles(*PACKAGES) == []


def test_the_circle_check_can_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "circled"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circled import b\n")
    (pkg / "b.py").write_text("def f():\n    from circled import c\n")  # a lazy import counts
    (pkg / "c.py").write_text("import circled.a\n")
    (pkg / "d.py").write_text("import circled.a\n")  # imports into the circle, not part of it
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_circles("circled") == [["circled.a", "circled.b", "circled.c"]]
