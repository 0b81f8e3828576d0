from __future__ import annotations

from pathlib import Path

import pytest

from slo.specs import (
    ENVIRONMENTS,
    FAILURE_CLASSES,
    KNOWN_SLIS,
    RecoveryObjective,
    SpecError,
    load_specs,
)


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_every_env_loads_all_slis_and_failure_classes(env: str) -> None:
    specs = load_specs(env=env)
    assert [s.name for s in specs.slos] == list(KNOWN_SLIS)
    assert list(specs.recovery_objectives) == list(FAILURE_CLASSES)
    for fc, ro in specs.recovery_objectives.items():
        assert isinstance(ro, RecoveryObjective)
        assert ro.name == ro.failure_class == ro.runbook == fc
        assert set(ro.slos) <= set(specs.slo_names)
        assert set(ro.expected_alerts) <= set(specs.alert_names)


def test_prod_objectives_are_realistic() -> None:
    prod = load_specs(env="prod")
    db = prod.recovery_objectives["db-primary-loss"]
    assert db.rpo.acknowledged_submissions == 0
    assert 0 < db.rto_seconds <= 5 * 60
    assert db.backup_retention_days is not None and db.backup_retention_days >= 7
    assert db.restore_point_seconds == db.rpo.restore_point_seconds
    assert db.restore_point_seconds is not None and db.restore_point_seconds > 0
    assert prod.recovery_objectives["artifact-store-unavailable"].scope == "region"
    assert all(s.window_seconds >= 7 * 86400 for s in prod.slos)


def test_local_objectives_fit_a_local_game_day() -> None:
    local, prod = load_specs(env="local"), load_specs(env="prod")
    for fc, ro in local.recovery_objectives.items():
        assert ro.rto_seconds <= 5 * 60, fc
        assert ro.rto_seconds <= prod.recovery_objectives[fc].rto_seconds, fc
    assert all(s.window_seconds <= 3600 for s in local.slos)
    assert local.recovery_objectives["artifact-store-unavailable"].scope == "zone"


def test_threshold_override_changes_only_what_it_names() -> None:
    local, prod = load_specs(env="local"), load_specs(env="prod")
    assert local.slo("queue-age").objective.value != prod.slo("queue-age").objective.value
    assert local.slo("queue-age").objective.target == prod.slo("queue-age").objective.target


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("rel", "old", "new", "expected"),
    [
        (
            "recovery/db-primary-loss.yaml",
            "rto: 2m",
            "rto: soon",
            ["recovery/db-primary-loss.yaml", "'db-primary-loss'", "spec.rto", "not a duration"],
        ),
        (
            "recovery/db-primary-loss.yaml",
            "acknowledgedSubmissions: 0",
            "acknowledgedSubmissions: -1",
            ["db-primary-loss", "spec.rpo.acknowledgedSubmissions", "greater than or equal to 0"],
        ),
        (
            "recovery/db-primary-loss.yaml",
            "  backupRetentionDays: 14\n",
            "",
            ["db-primary-loss", "spec.backupRetentionDays", "required"],
        ),
        (
            "recovery/artifact-store-unavailable.yaml",
            "scope: region",
            "scope: planet",
            ["artifact-store-unavailable", "spec.scope"],
        ),
        (
            "recovery/node-pool-exhausted.yaml",
            "[QueueAgeBurnRate]",
            "[QueueAgeTooHigh]",
            ["node-pool-exhausted", "spec.expectedAlerts[0]", "QueueAgeTooHigh"],
        ),
        (
            "recovery/registry-failure.yaml",
            "runbook: registry-failure",
            "runbok: registry-failure",
            ["registry-failure", "spec.runbok", "unknown field"],
        ),
        (
            "recovery/agent-connectivity-loss.yaml",
            "invariants: [fencing]",
            "invariants: [fencing, fenceing]",
            ["recovery/agent-connectivity-loss.yaml", "'agent-connectivity-loss'",
             "spec.invariants[1]", "unknown invariant 'fenceing'", "bounded-retries"],
        ),
        (
            "recovery/overload-metastability.yaml",
            "recoveredBy: goodput",
            "recoveredBy: throughput",
            ["overload-metastability", "spec.recoveredBy", "'slis' or 'goodput'"],
        ),
        (
            "recovery/registry-failure.yaml",
            "invariants: [bounded-retries]",
            "invariants: bounded-retries",
            ["registry-failure", "spec.invariants", "must be a list of strings"],
        ),
        (
            "openslo/queue-age.yaml",
            "target: 0.99,",
            "target: 1.5,",
            ["openslo/queue-age.yaml", "SLO 'queue-age'", "spec.objectives[0].target"],
        ),
        (
            "openslo/api-availability.yaml",
            "${api_errors}",
            "${api_erors}",
            ["api-availability", "api_erors", "METRICS"],
        ),
        (
            "openslo/alerting.yaml",
            "threshold: 14.4",
            "threshold: -1",
            ["alerting.yaml", "'page-fast-burn'", "spec.condition.threshold"],
        ),
        (
            "env/local.yaml",
            "queue-age: {objective:",
            "queue-agee: {objective:",
            ["env/local.yaml", "spec.slos.queue-agee", "no SLO"],
        ),
    ],
)
def test_spec_errors_name_file_document_and_field(
    spec_copy: Path, rel: str, old: str, new: str, expected: list[str]
) -> None:
    _edit(spec_copy / rel, old, new)
    with pytest.raises(SpecError) as err:
        load_specs(env="local", spec_dir=spec_copy)
    for part in expected:
        assert part in str(err.value)


def test_missing_failure_class_is_an_error(spec_copy: Path) -> None:
    (spec_copy / "recovery" / "registry-failure.yaml").unlink()
    with pytest.raises(SpecError, match="registry-failure"):
        load_specs(env="prod", spec_dir=spec_copy)


def test_broken_yaml_and_unknown_env(spec_copy: Path) -> None:
    (spec_copy / "openslo" / "queue-age.yaml").write_text("kind: [unclosed\n")
    with pytest.raises(SpecError, match="queue-age.yaml: not valid YAML"):
        load_specs(env="prod", spec_dir=spec_copy)
    with pytest.raises(SpecError, match="unknown environment 'qa'"):
        load_specs(env="qa")


def test_invariants_are_wired_to_their_failure_classes() -> None:
    ros = load_specs(env="local").recovery_objectives
    assert ros["agent-connectivity-loss"].invariants == ["fencing"]
    assert ros["registry-failure"].invariants == ["bounded-retries"]
    assert ros["ineligible-fallback-region"].invariants == ["eligible-placement"]
    assert ros["api-replica-loss"].invariants == []
