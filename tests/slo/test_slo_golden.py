"""Golden verdicts: the evaluator's whole answer for a set of seeded runs, kept byte for byte.

Refactoring the evaluator (steps, typed criteria) must not change one figure, status or text of
any verdict. Each variant below leaves something out or breaks something on purpose, so the
golden files cover the fail-closed paths as well as the healthy one. Regenerate on purpose
only: `GAMEDAY_REGOLDEN=1 pytest tests/slo/test_slo_golden.py`, and read the diff.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from slo.evaluate import evaluate_run
from slo.fixtures import ExperimentFixture, FixtureSpec, build_run, example_experiments

GOLDEN = Path(__file__).parent / "golden"
_SUITE = example_experiments()


def _with(name: str, **changes: object) -> tuple[ExperimentFixture, ...]:
    return tuple(replace(x, **changes) if x.name == name else x for x in _SUITE)


VARIANTS: dict[str, FixtureSpec] = {
    "example-suite": FixtureSpec(experiments=_SUITE),
    "lost-acks": FixtureSpec(experiments=_with("api-replica-loss", lost_acks=3), lost_acks=2),
    "torn-resume": FixtureSpec(experiments=_with("node-interruption-checkpoint", torn_resume=True)),
    "no-journal": FixtureSpec(experiments=_with("db-primary-loss", journal=False)),
    "steady-state-not-met": FixtureSpec(
        experiments=_with("registry-failure", steady_state_before=False)),
    "fault-not-recorded": FixtureSpec(
        experiments=_with("node-pool-exhausted", record_fault=False)),
    "stuck-after-fault": FixtureSpec(
        experiments=_with("api-replica-loss", stuck_after_fault=5.0)),
    "deviated": FixtureSpec(experiments=_with("registry-failure", deviated=True)),
    "no-writes-no-retries-no-agents": FixtureSpec(
        experiments=_SUITE, report_writes=False, max_retries=None, agents=False),
    "experiments-not-listed": FixtureSpec(experiments=_SUITE[:2], list_experiments=False),
}


def _verdict_json(path: Path) -> str:
    data = evaluate_run(path).model_dump(mode="json")
    for e in data["experiments"]:
        for s in e["slis"]:  # the sampled series kept as a digest: every value still counts
            s["series"] = hashlib.sha256(json.dumps(s["series"]).encode()).hexdigest()
        e["load"] = hashlib.sha256(json.dumps(e["load"]).encode()).hexdigest()
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_verdict_unchanged(tmp_path: Path, name: str) -> None:
    build_run(tmp_path / name, VARIANTS[name])
    got = _verdict_json(tmp_path / name)
    golden = GOLDEN / f"{name}.json"
    if os.environ.get("GAMEDAY_REGOLDEN"):
        golden.write_text(got)
    assert golden.exists(), f"{golden}: missing (GAMEDAY_REGOLDEN=1 writes it)"
    assert got == golden.read_text(), f"verdict of {name} changed: diff against {golden}"
