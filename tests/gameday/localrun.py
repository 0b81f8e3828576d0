"""Running `gameday` for real against a local environment from tests: the CLI as a subprocess,
the run directory, and the check that nothing is left running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from environments.local import procs


def gameday(*args: str, home: Path, extra_env: dict[str, str] | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GAMEDAY_HOME": str(home), **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "gameday.cli", *args], env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)


def only_run(runs: Path) -> Path:
    (run_dir,) = list(runs.iterdir())
    return run_dir


def assert_no_processes(home: Path) -> None:
    state = home / ".gameday" / "envs" / "local"
    deadline = time.monotonic() + 10
    while procs.marked_processes(state) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert procs.marked_processes(state) == []


def env_secrets(state: Path) -> dict[str, str]:
    """Every secret the local environment holds (env.json), by a name that says which."""
    import json

    info = json.loads((state / "env.json").read_text())
    found: dict[str, str] = {}

    def walk(value: object, path: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}")
        elif isinstance(value, str) and len(value) >= 12:  # generated secrets are long
            found[path] = value

    walk(info.get("secrets", {}), "secrets")
    walk({k: v for k, v in info.items() if k.endswith("password")}, "env")
    for platform, data in (info.get("platforms") or {}).items():
        if isinstance(data, dict):
            walk({k: v for k, v in data.items() if "password" in k or "token" in k}, platform)
    return found


def leaked_secrets(roots: list[Path], secrets: dict[str, str]) -> list[tuple[str, str]]:
    """(file, secret name) for every file under ``roots`` that contains a secret verbatim."""
    leaks: list[tuple[str, str]] = []
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            data = path.read_bytes()
            leaks += [(str(path), name) for name, value in secrets.items() if value.encode() in data]
    return leaks
