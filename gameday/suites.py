"""Experiment suites, what each experiment will touch (for `--dry-run`), and whether they are
runnable at all (`gameday validate`, and `gameday run`'s preflight)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml

from chaos import actions, gray, overload, restore, serving
from chaos.validate import validate_experiments
from slo.specs import ENVIRONMENTS

EXPERIMENT_DIR = Path(__file__).resolve().parent.parent / "chaos" / "experiments"

# ci: the three classes that guard the core promise (durable intake, failover, fencing), <= 3 min.
# core: every failure class (docs/DESIGN.md section 3).
# full: core + the slower rehearsals (restore from backup, rolling upgrade) and the classes
# beyond the core.
SUITES: dict[str, tuple[str, ...]] = {
    "ci": ("api-replica-loss", "db-primary-loss", "agent-connectivity-loss"),
    "core": ("api-replica-loss", "db-primary-loss", "db-unreachable-from-api-replica",
             "agent-connectivity-loss",
             "artifact-store-unavailable", "node-pool-exhausted", "registry-failure",
             "node-interruption-checkpoint", "ineligible-fallback-region"),
}
# credential rotation replaces the environment's credentials for good: full only
# The upgrade leaves the schema expanded (release N runs on it by design, docs/upgrades.md):
# last, so every other class runs on the schema it was written for.
# The storage classes need the storage layer (`env up --storage-faults`): without it the local
# environment reports them not applicable, with the reason.
# tracking-outage needs MLflow's tracking server (`env up --tracking`); without it the local
# environment reports it not applicable, with the reason.
# overload-metastability drives the API near its capacity (most of a small machine's CPU) and
# leaves thousands of blocked operations behind: after every class whose load it would disturb.
# The serving classes need model serving (`env up --serving`); without it, not applicable.
SUITES["full"] = (*SUITES["core"], "db-restore-from-backup", "clock-skew", "credential-rotation",
                  "zone-outage", "telemetry-loss", "pipeline-recovery", "data-source-unavailable",
                  "network-gray",
                  "artifact-store-brownout", "db-slow-disk", "db-disk-full",
                  "overload-metastability", "checkpoint-power-loss", "tracking-outage",
                  "serving-replica-loss", "bad-model-rollout", "model-store-unavailable",
                  "upgrade")

# Marked where they are defined (FAULTS of each provider module), never copied here.
FAULT_FUNCS = (frozenset(actions.FAULTS) | frozenset(restore.FAULTS) | frozenset(gray.FAULTS)
               | frozenset(overload.FAULTS) | frozenset(serving.FAULTS))


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


def experiment_path(name: str) -> Path:
    return EXPERIMENT_DIR / f"{name}.yaml"


def validate_names(names: list[str], env: str = "local") -> list[str]:
    """Every problem of these experiments (chaos/validate.py), judged against ``env``'s specs."""
    return validate_experiments([experiment_path(n) for n in names], env)


def experiment_requires(name: str) -> tuple[str, ...]:
    """What an experiment declares it needs from the environment (x-gameday ``requires``,
    e.g. ``storage-faults``); one that cannot be read requires nothing here (`gameday
    validate` reports it)."""
    try:
        requires = load_experiment(name).gameday.get("requires") or []
    except (SuiteError, AttributeError):
        return ()
    return tuple(str(r) for r in requires) if isinstance(requires, list) else ()


def load_experiment(name: str) -> Experiment:
    path = experiment_path(name)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SuiteError(f"{path}: cannot read experiment: {exc}") from exc
    return Experiment(name, path, doc)


@click.command("validate")
@click.option("--suite", type=click.Choice(list(SUITES)), default=None,
              help="Validate this suite's experiments (default: every experiment).")
@click.option("--env", default="local", show_default=True, type=click.Choice(ENVIRONMENTS),
              help="Whose SLO specs name the recovery objectives.")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path, dir_okay=False))
def validate_cmd(suite: str | None, env: str, files: tuple[Path, ...]) -> None:
    """Check experiments before a run, without touching anything: Chaos Toolkit's validation,
    each python provider's module, function and arguments, the x-gameday objective, runbook
    and blast radius. Exit 1 and one line per problem if any."""
    if suite and files:
        raise click.UsageError("give --suite or FILE..., not both")
    paths = (list(files) if files else
             [experiment_path(n) for n in SUITES[suite]] if suite else
             sorted(EXPERIMENT_DIR.glob("*.yaml")))
    problems = validate_experiments(paths, env)
    for problem in problems:
        click.echo(problem)
    if problems:
        click.echo(f"{len(problems)} problem(s) in {len(paths)} experiment(s)", err=True)
        sys.exit(1)
    click.echo(f"validated {len(paths)} experiments: no problems")
