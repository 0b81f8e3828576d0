"""`gameday selftest`: prove each failure class's experiment catches a broken platform.

For every seeded defect (controlplane/defects.py: a hidden, test-only switch that breaks one
promise of the reference control plane) the local environment's control-plane processes are
restarted with the defect on, the experiment meant to catch it runs as a normal game day
(background load, evidence, evaluation), and the defect counts as caught only when the gate
fails (exit 2) with the *named* objective among the failed checks. A probe failing, or some
other objective failing, is reported but is not "caught": the matrix shows what each objective
really detects. The healthy platform passing the same experiments is the other half of the
proof (`gameday run --suite core`).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from environments.local.storage import REQUIREMENT as STORAGE
from environments.local.tracking import REQUIREMENT as TRACKING
from environments.local.tracking import missing as tracking_missing
from gameday.run import EXIT_REFUSED, Options, resolve_home, run_gameday
from gameday.suites import SUITES, experiment_requires


@dataclass(frozen=True)
class Case:
    failure_class: str
    defect: str
    experiment: str
    objective: str  # the check id that must fail


MATRIX: tuple[Case, ...] = (
    Case("api-replica-loss", "ack-before-commit", "api-replica-loss",
         "api-replica-loss.rpo.acknowledged_submissions"),
    Case("api-replica-loss", "idempotency-ignored", "api-replica-loss",
         "api-replica-loss.rpo.acknowledged_submissions"),
    Case("db-primary-loss", "readyz-lies", "db-unreachable-from-api-replica",
         "db-unreachable-from-api-replica.invariant.served-after-detection"),
    Case("agent-connectivity-loss", "fencing-off", "agent-connectivity-loss",
         "agent-connectivity-loss.invariant.fencing"),
    Case("agent-connectivity-loss", "leases-never-expire", "agent-connectivity-loss",
         "agent-connectivity-loss.rto"),
    Case("artifact-store-unavailable", "success-without-artifacts", "artifact-store-unavailable",
         "artifact-store-unavailable.rpo.artifacts"),
    Case("node-pool-exhausted", "blocked-never-drain", "node-pool-exhausted",
         "node-pool-exhausted.rto"),
    Case("registry-failure", "retries-unbounded", "registry-failure",
         "registry-failure.invariant.bounded-retries"),
    Case("node-interruption-checkpoint", "torn-checkpoint-resume", "node-interruption-checkpoint",
         "node-interruption-checkpoint.rpo.checkpoint_progress"),
    Case("ineligible-fallback-region", "ineligible-fallback", "ineligible-fallback-region",
         "ineligible-fallback-region.invariant.eligible-placement"),
    Case("upgrade", "contract-too-early", "upgrade", "upgrade.invariant.served-after-detection"),
    Case("telemetry-loss", "readyz-needs-telemetry", "telemetry-loss", "telemetry-loss.rto"),
)
MATRIX += (
    Case("clock-skew", "lease-from-agent-clock", "clock-skew",
         "clock-skew.invariant.lease-granted-once"),
    Case("credential-rotation", "token-cached-forever", "credential-rotation",
         "credential-rotation.invariant.leases-held"),
)
MATRIX += (Case("zone-outage", "zone-sticky-retry", "zone-outage", "zone-outage.rto"),)
MATRIX += (
    Case("network-gray", "deadline-beyond-lease", "network-gray",
         "network-gray.invariant.leases-held"),
    # the same promise broken on the server: a lost claim answer's grant is not handed back
    Case("network-gray", "claim-redelivery-skipped", "network-gray",
         "network-gray.invariant.leases-held"),
    Case("artifact-store-brownout", "storage-retry-no-backoff", "artifact-store-brownout",
         "artifact-store-brownout.invariant.bounded-retry-amplification"),
    Case("artifact-store-brownout", "verify-starves-lease", "artifact-store-brownout",
         "artifact-store-brownout.invariant.leases-held"),
)
MATRIX += (
    Case("db-slow-disk", "readyz-commit-deadline", "db-slow-disk",
         "db-slow-disk.invariant.served-after-detection"),
    Case("db-disk-full", "ack-unknown-outcome", "db-disk-full",
         "db-disk-full.rpo.acknowledged_submissions"),
    Case("checkpoint-power-loss", "checkpoint-no-fsync", "checkpoint-power-loss",
         "checkpoint-power-loss.invariant.reported-checkpoints-durable"),
    Case("checkpoint-power-loss", "local-checkpoint-unverified", "checkpoint-power-loss",
         "checkpoint-power-loss.invariant.durable-resume"),
)
MATRIX += (
    Case("overload-metastability", "admission-unbounded", "overload-metastability",
         "overload-metastability.invariant.goodput-recovered"),
    Case("overload-metastability", "admission-wait-unbounded", "overload-metastability",
         "overload-metastability.invariant.goodput-recovered"),
)
# the outcome invariants (slo/outcome_invariants.py): each promise broken in a second code path,
# caught by the objective that judges the outcome, not the path
MATRIX += (
    Case("artifact-store-unavailable", "result-not-read-back", "artifact-store-unavailable",
         "artifact-store-unavailable.invariant.artifacts-complete"),
    Case("node-pool-exhausted", "liveness-ignored", "node-pool-exhausted",
         "node-pool-exhausted.invariant.routed-to-live-agents"),
    Case("credential-rotation", "revocation-cached", "credential-rotation",
         "credential-rotation.invariant.retired-credentials-refused"),
    Case("credential-rotation", "agent-revocation-ignored", "credential-rotation",
         "credential-rotation.invariant.retired-credentials-refused"),
)
MATRIX += (
    Case("pipeline-recovery", "cache-key-without-data", "pipeline-recovery",
         "pipeline-recovery.invariant.stale-cache-reuse"),
    Case("pipeline-recovery", "registration-without-receipt", "pipeline-recovery",
         "pipeline-recovery.invariant.side-effect-once"),
    Case("pipeline-recovery", "release-after-failed-check", "pipeline-recovery",
         "pipeline-recovery.invariant.release-after-checks"),
)
# data at start: the same promise broken in the workload (the digest never compared) and in
# the control plane (the names of the sources left out dropped on acceptance)
MATRIX += (
    Case("data-source-unavailable", "source-digest-unchecked", "data-source-unavailable",
         "data-source-unavailable.invariant.sources-accounted"),
    Case("data-source-unavailable", "excluded-source-unnamed", "data-source-unavailable",
         "data-source-unavailable.invariant.sources-accounted"),
)
# tracking-outage: two code paths of the workload's tracking sink (controlplane/workload/
# tracking.py): the send of a metric batch (its failure throws the batch away) and the end of
# the run (told once, not retried)
MATRIX += (
    Case("tracking-outage", "tracking-flush-drops-batch", "tracking-outage",
         "tracking-outage.invariant.metric-points-kept"),
    Case("tracking-outage", "tracking-finish-once", "tracking-outage",
         "tracking-outage.invariant.runs-terminated"),
)
# serving: the same promise (a loading replica gets no prediction) broken in the load
# balancer's generated config and in the model server's readiness
MATRIX += (
    Case("serving-replica-loss", "serving-check-liveness", "serving-replica-loss",
         "serving-replica-loss.invariant.serving-availability"),
    Case("serving-replica-loss", "ready-before-loaded", "serving-replica-loss",
         "serving-replica-loss.invariant.serving-availability"),
)
# bad-model-rollout: the rollout controller's decision path (a failing canary held, not rolled
# back) and its traffic path (the canary's weight that of a full share whatever the step)
MATRIX += (
    Case("bad-model-rollout", "rollback-off", "bad-model-rollout",
         "bad-model-rollout.invariant.rolled-back-within-rto"),
    Case("bad-model-rollout", "canary-weight-ignored", "bad-model-rollout",
         "bad-model-rollout.invariant.bad-version-share"),
)
# model-store-unavailable: a replica that could not read its model must not answer, broken in
# the model server (a failed load goes ready with what it had) and in the harness's scale-up
# (the new replica enabled in HAProxy without its readiness check)
MATRIX += (
    Case("model-store-unavailable", "serve-partial-model", "model-store-unavailable",
         "model-store-unavailable.invariant.no-half-loaded-model"),
    Case("model-store-unavailable", "scale-up-skips-readiness", "model-store-unavailable",
         "model-store-unavailable.invariant.store-outage-availability"),
)


@dataclass
class Result:
    case: Case
    caught: bool
    exit_code: int
    failed_checks: list[str]
    run_dir: str | None
    seconds: float
    note: str = ""


def judge(case: Case, exit_code: int, verdict: dict[str, Any] | None) -> tuple[bool, list[str], str]:
    """Caught = the gate failed on objectives (exit 2) and the named objective is among the
    failed checks. Pure: the verdict JSON in, the decision out."""
    if verdict is None:
        return False, [], f"no verdict (exit {exit_code})"
    failed = [c["id"] for c in verdict.get("checks", [])
              if c.get("status") == "fail" and c.get("experiment") == case.experiment]
    if case.objective not in failed:
        why = f"{case.objective} did not fail" + (f" (failed: {', '.join(failed)})" if failed else "")
        return False, failed, why
    if exit_code != 2:
        return False, failed, f"{case.objective} failed but the run exited {exit_code}, not 2"
    return True, failed, ""


def select(defects: tuple[str, ...], suite: str) -> list[Case]:
    """The matrix rows to run: the named defects (any suite), else every row of the suite."""
    if defects:
        return [c for c in MATRIX if c.defect in defects]
    return [c for c in MATRIX if c.experiment in SUITES[suite]]


def _only_run(runs: Path) -> Path | None:
    dirs = [p for p in runs.iterdir() if p.is_dir()] if runs.is_dir() else []
    return dirs[0] if len(dirs) == 1 else None


def run_case(case: Case, env: Any, runs: Path, log: Path, home: Path) -> Result:
    started = time.monotonic()
    # only this defect on (the previous case's is switched off by the same restart)
    env.set_defects([case.defect])
    with open(log, "w") as out:
        code = run_gameday(Options(experiments=(case.experiment,), runs_dir=runs,
                                   home=home, suite="selftest"),
                           Console(file=out, width=120, force_terminal=False))
    run_dir = _only_run(runs)
    verdict = None
    if run_dir is not None and (run_dir / "verdict.json").exists():
        verdict = json.loads((run_dir / "verdict.json").read_text())
    caught, failed, note = judge(case, code, verdict)
    return Result(case, caught, code, failed, str(run_dir) if run_dir else None,
                  round(time.monotonic() - started, 1), note)


def _table(results: list[Result]) -> Table:
    t = Table(title="seeded defects: does each experiment catch its broken promise?")
    for col in ("failure class", "defect", "experiment", "result", "caught by", "exit", "s"):
        t.add_column(col)
    for r in results:
        t.add_row(r.case.failure_class, r.case.defect, r.case.experiment,
                  "[green]caught[/]" if r.caught else
                  "[yellow]not run[/]" if r.note.startswith("not run:") else "[red]MISSED[/]",
                  r.case.objective if r.caught else r.note, str(r.exit_code), f"{r.seconds:.0f}")
    return t


@click.command("selftest")
@click.option("--defect", "defects", multiple=True, type=click.Choice([c.defect for c in MATRIX]),
              help="Only this seeded defect (repeatable); default: the whole matrix.")
@click.option("--suite", type=click.Choice([s for s in SUITES if s != "ci"]), default="full",
              show_default=True,
              help="Only the defects whose experiment is in this suite.")
@click.option("--runs-dir", type=click.Path(path_type=Path, file_okay=False),
              default=Path("runs"), show_default=True,
              help="Run directories go to RUNS_DIR/selftest-<time>/<defect>/.")
@click.option("--down-after/--keep-env", default=False,
              help="Take down an environment this command brought up (default: keep it).")
def selftest_cmd(defects: tuple[str, ...], suite: str, runs_dir: Path, down_after: bool) -> None:
    """Run each seeded control-plane defect against the experiment meant to catch it and print
    the matrix: failure class, defect, experiment, caught/missed, the objective that caught it.
    Local environment only; exit 0 when every defect was caught by its named objective."""
    from environments.local.env import LocalEnvironment
    from environments.local.errors import EnvError
    from environments.local.platform import local_platform

    console = Console(width=None if sys.stdout.isatty() else 160)
    home = resolve_home(None)
    cases = select(defects, suite)
    env = LocalEnvironment("local", home)
    if not env.info:  # a new environment gets the layers its cases need
        needs = {r for c in cases for r in experiment_requires(c.experiment)}
        env = LocalEnvironment("local", home, storage_faults=STORAGE in needs,
                               tracking=TRACKING in needs and tracking_missing() is None)
    started_env = False
    if not env.is_running():
        console.print("bringing up the local environment ...")
        try:
            env.up(reporter=lambda m: console.print(f"  {m}", highlight=False))
        except EnvError as exc:
            console.print(f"[bold red]refused[/]: the environment did not come up: {exc}")
            sys.exit(EXIT_REFUSED)
        started_env = True
    env = LocalEnvironment.load("local", home)
    if not local_platform(env.info.get("platform", "controlplane")).CONTROLPLANE:
        console.print("[bold red]refused[/]: seeded defects exist for the reference control "
                      "plane only; this environment runs " + env.info["platform"])
        sys.exit(EXIT_REFUSED)
    root = (runs_dir / ("selftest-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))).resolve()
    root.mkdir(parents=True)
    results: list[Result] = []
    try:
        for i, case in enumerate(cases, 1):
            console.print(f"[{i}/{len(cases)}] {case.defect} -> {case.experiment} ...",
                          highlight=False)
            t0 = time.monotonic()
            why_not = env.applicability(case.experiment, experiment_requires(case.experiment))
            try:
                if why_not:  # never run, never "missed": the row says what it needs
                    r = Result(case, False, EXIT_REFUSED, [], None, 0.0, f"not run: {why_not}")
                else:
                    r = run_case(case, env, root / case.defect, root / f"{case.defect}.log",
                                 home)
            except Exception as exc:  # noqa: BLE001 - one crashed row must not hide the others
                r = Result(case, False, -1, [], None, round(time.monotonic() - t0, 1),
                           f"crashed: {type(exc).__name__}: {exc}"[:300])
            results.append(r)
            verdict = ("caught by " + case.objective if r.caught else
                       r.note if r.note.startswith("not run:") else "MISSED: " + r.note)
            console.print(f"    {verdict} (exit {r.exit_code}, {r.seconds:.0f}s)",
                          highlight=False)
            (root / "selftest.json").write_text(json.dumps(
                [{**asdict(x.case), **{k: v for k, v in asdict(x).items() if k != "case"}}
                 for x in results], indent=2))
    finally:
        env.set_defects([])  # the healthy platform again, also after Ctrl-C
        if started_env and down_after:
            env.down()
    console.print(_table(results))
    caught = sum(r.caught for r in results)
    console.print(f"{caught}/{len(results)} seeded defects caught by their named objective; "
                  f"evidence in {root}", highlight=False)
    sys.exit(0 if caught == len(results) else 1)
