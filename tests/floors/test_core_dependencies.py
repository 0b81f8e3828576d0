"""The control-plane image installs only the core dependencies of pyproject.toml (the harness
and the Pulumi program are extras). Every module ``controlplane/`` imports, anywhere in a
file, must come from the standard library, ``controlplane`` itself, or a distribution in the
core dependencies' closure, else the slim image fails at runtime."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def core_closure(requirements: list[str]) -> set[str]:
    """Distributions installed by ``pip install .`` (no extras): installed metadata walked."""
    seen: set[str] = set()
    queue = [(Requirement(r), frozenset(Requirement(r).extras)) for r in requirements]
    while queue:
        req, extras = queue.pop()
        name = _norm(req.name)
        key = f"{name}[{','.join(sorted(extras))}]"
        if key in seen:
            continue
        seen.add(key)
        seen.add(name)
        for raw in md.distribution(req.name).requires or []:
            sub = Requirement(raw)
            envs = [{"extra": e} for e in (extras or {""})]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in envs):
                queue.append((sub, frozenset(sub.extras)))
    return {s for s in seen if "[" not in s}


def imported_modules(package: Path) -> dict[str, set[str]]:
    """top-level module -> files importing it (absolute imports, function-level ones too)."""
    found: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(package.parent)))
    return found


# Files that are not part of the control-plane image but run in a virtualenv of their own,
# with the one module each may import beyond the core: the model server runs in .venv-kserve
# (scripts/setup-kserve.sh), as KServe's own image would in a cluster.
OWN_VENV = {"controlplane/serving/server.py": {"kserve"}}


def missing_from_core(package: Path, requirements: list[str],
                      own_venv: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    closure = core_closure(requirements)
    providers = md.packages_distributions()
    allowed = own_venv or {}
    out = {}
    for module, files in imported_modules(package).items():
        if module in sys.stdlib_module_names or module == package.name or module == "__future__":
            continue
        if not any(_norm(d) in closure for d in providers.get(module, [])):
            files = {f for f in files if module not in allowed.get(f, set())}
            if files:
                out[module] = files
    return out


def _core_requirements() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def test_the_control_plane_runs_on_the_core_dependencies_alone() -> None:
    assert missing_from_core(REPO / "controlplane", _core_requirements(), OWN_VENV) == {}


def test_the_check_sees_a_harness_only_import(tmp_path: Path) -> None:
    pkg = tmp_path / "controlplane"
    pkg.mkdir()
    (pkg / "report.py").write_text("def render():\n    import rich.console\n    import json\n")
    missing = missing_from_core(pkg, _core_requirements())
    assert set(missing) == {"rich"}
    # and a dependency moved out of the core list is seen too
    without_boto = [r for r in _core_requirements() if not r.startswith("boto3")]
    assert "boto3" in missing_from_core(REPO / "controlplane", without_boto)
    # a file of its own venv may import only what it is declared with
    (pkg / "serve.py").write_text("import kserve\nimport rich\n")
    missing = missing_from_core(pkg, _core_requirements(), {"controlplane/serve.py": {"kserve"}})
    assert missing == {"rich": {"controlplane/report.py", "controlplane/serve.py"}}
