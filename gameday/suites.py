"""Experiment suites and what each experiment will touch (for `--dry-run`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from chaos import actions, restore

EXPERIMENT_DIR = Path(__file__).resolve().parent.parent / "chaos" / "experiments"

# ci: the three classes that guard the core promise (durable intake, failover, fencing), <= 3 min.
# core: every failure class (docs/DESIGN.md section 3).
# full: core + the slower rehearsals (restore from backup).
SUITES: dict[str, tuple[str, ...]] = {
    "ci": ("api-replica-loss", "db-primary-loss", "agent-connectivity-loss"),
    "core": ("api-replica-loss", "db-primary-loss", "db-unreachable-from-api-replica",
             "agent-connectivity-loss",
             "artifact-store-unavailable", "node-pool-exhausted", "registry-failure",
             "node-interruption-checkpoint", "ineligible-fallback-region"),
}
SUITES["full"] = (*SUITES["core"], "db-restore-from-backup")

# Marked where they are defined (FAULTS of each provider module), never copied here.
FAULT_FUNCS = frozenset(actions.FAULTS) | frozenset(restore.FAULTS)


class SuiteError(Exception):
    pass


@dataclass(frozen=True)
class Experiment:
    name: str
    path: Path
    doc: dict[str, Any]

    @property
    def gameday(self) -> dict[str, Any]:
        for ext in self.doc.get("extensions", []):
            if ext.get("name") == "x-gameday":
                return ext
        return self.doc.get("x-gameday", {})

    def faults(self) -> list[str]:
        """Human-readable list of the faults the method injects."""
        out = []
        for act in self.doc.get("method", []):
            prov = act.get("provider", {})
            if prov.get("func") in FAULT_FUNCS:
                args = ", ".join(f"{k}={v}" for k, v in (prov.get("arguments") or {}).items())
                out.append(f"{prov['func']}({args})")
        return out


def experiment_names(suite: str | None, only: tuple[str, ...] = ()) -> list[str]:
    if only:
        unknown = [n for n in only if not (EXPERIMENT_DIR / f"{n}.yaml").exists()]
        if unknown:
            known = sorted(p.stem for p in EXPERIMENT_DIR.glob("*.yaml"))
            raise SuiteError(f"unknown experiment(s) {unknown}; known: {', '.join(known)}")
        return list(only)
    if suite not in SUITES:
        raise SuiteError(f"unknown suite {suite!r}; suites: {', '.join(SUITES)}")
    return list(SUITES[suite])


def load_experiment(name: str) -> Experiment:
    path = EXPERIMENT_DIR / f"{name}.yaml"
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SuiteError(f"{path}: cannot read experiment: {exc}") from exc
    return Experiment(name, path, doc)
