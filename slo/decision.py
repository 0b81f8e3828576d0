"""Exit code, result and reason of a verdict: one pure function, so the CLI, verdict.json,
junit.xml and both reports can only ever say the same thing.

Precedence 3 > 2 > 1 > 0:
  3  an expected experiment is missing from the evidence (no journal): the verdict is partial
  2  a key objective failed (key SLI incl. no data, rto, rpo.*, invariant.*), or the score is
     below the warning threshold / nothing was measurable
  1  an experiment failed, or ran but was not measured (steady state broken, no fault)
  0  the gate passed or warned
`result` is "pass"/"warning" only with exit 0, "fail" with 1 or 2, "error" with 3.

An objective that regressed against the last passing run (slo/baseline.py) is named in the
reason and turns a "pass" into a "warning"; it never changes the exit code: relative criteria
flag a trend, the absolute objectives decide the gate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slo.scoring import GateOutcome, Status
from slo.verdict import Check, ExperimentResult

EXIT_PASS = 0
EXIT_EXPERIMENT = 1
EXIT_OBJECTIVE = 2
EXIT_EVIDENCE = 3


@dataclass(frozen=True)
class Decision:
    result: str
    exit_code: int
    reason: str


def _experiment_failure(e: ExperimentResult) -> str:
    return f"{e.name} (journal status {e.journal_status}{', deviated' if e.deviated else ''})"


def decide(
    checks: Sequence[Check],
    experiments: Sequence[ExperimentResult],
    gate: GateOutcome,
    warning_score: float,
    regressed: Sequence[str] = (),
    baseline_run: str | None = None,
) -> Decision:
    missing = [e for e in experiments if not e.journal_present]
    not_measured = [e for e in experiments if e.journal_present and not e.measured]
    failed_runs = [e for e in experiments if e.measured and not e.experiment_ok]
    key_failed = [c.id for c in checks if c.key and c.status == Status.FAIL.value]
    causes: list[str] = []
    if missing:
        causes.append("missing from the evidence: " + ", ".join(
            f"{e.name} ({e.not_measured_reason})" for e in missing))
    if key_failed:
        causes.append("key objective(s) missed: " + ", ".join(key_failed))
    elif gate.status is Status.FAIL:
        causes.append(
            f"score {gate.score:.1f} below warning threshold {warning_score:g}"
            if gate.score is not None else "no measurable objective")
    if failed_runs:
        causes.append("experiment(s) failed: " + ", ".join(map(_experiment_failure, failed_runs)))
    if not_measured:
        causes.append("not measured: " + ", ".join(
            f"{e.name} ({e.not_measured_reason})" for e in not_measured))
    if regressed:
        causes.append(f"regressed against last passing run {baseline_run}: "
                      + ", ".join(regressed))

    if missing:
        code = EXIT_EVIDENCE
    elif key_failed or gate.status is Status.FAIL:
        code = EXIT_OBJECTIVE
    elif failed_runs or not_measured:
        code = EXIT_EXPERIMENT
    else:
        code = EXIT_PASS
    if code == EXIT_PASS:
        missed = [c.id for c in checks if c.status == Status.FAIL.value]
        warned = [c.id for c in checks if c.status == Status.WARNING.value]
        causes.append(
            f"gate {gate.status.value}; non-key objective(s) missed: " + ", ".join(missed)
            if missed else
            f"gate {gate.status.value}; warning(s): " + ", ".join(warned)
            if warned else "all objectives met")
    no_data = [c.id for c in checks if c.status == Status.NO_DATA.value]
    if no_data:
        causes.append("no data (not scored): " + ", ".join(no_data))
    result = ("error" if code == EXIT_EVIDENCE
              else "fail" if code != EXIT_PASS
              else Status.WARNING.value if regressed
              else gate.status.value)
    return Decision(result, code, "; ".join(causes))
