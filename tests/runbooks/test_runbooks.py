"""Runbooks: every one parses with all sections, every alert / recovery objective / experiment
links an existing runbook of the right kind, every runbook is linked, and every `gameday ...`
command in a "Local environment" block is a real subcommand that accepts its options."""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gameday.cli import main
from slo.runbooks import (
    RECOVER_SUBSECTIONS,
    RUNBOOK_DIR,
    SECTIONS,
    Kind,
    RunbookError,
    alert_runbook_refs,
    check_references,
    experiment_runbook_refs,
    load_runbooks,
    objective_runbook_refs,
)
from slo.specs import ENVIRONMENTS, FAILURE_CLASSES

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "chaos" / "experiments"


@pytest.fixture(scope="module")
def runbooks():
    return load_runbooks(RUNBOOK_DIR)


@pytest.fixture(scope="module")
def alert_refs() -> dict[str, set[str]]:
    return alert_runbook_refs(ENVIRONMENTS)


@pytest.fixture(scope="module")
def objective_refs() -> dict[str, set[str]]:
    return objective_runbook_refs(ENVIRONMENTS)


# --- the real runbooks ------------------------------------------------------------------


def test_every_runbook_parses_with_all_sections(runbooks) -> None:
    assert runbooks, "no runbooks found"
    for rb in runbooks.values():
        assert [s for s in rb.sections if s in SECTIONS] == list(SECTIONS), rb.path
        assert set(RECOVER_SUBSECTIONS) <= set(rb.recover), rb.path


def test_one_failure_class_runbook_per_failure_class(runbooks) -> None:
    failure = {i for i, rb in runbooks.items() if rb.kind is Kind.FAILURE_CLASS}
    assert failure == set(FAILURE_CLASSES)
    for rb_id in failure:
        assert runbooks[rb_id].experiment == f"chaos/experiments/{rb_id}.yaml"


def test_every_alert_annotation_resolves_to_an_alert_runbook(runbooks, alert_refs) -> None:
    assert alert_refs, "generated rules carry no runbook annotation"
    for rb_id, alerts in alert_refs.items():
        assert rb_id in runbooks, f"alert(s) {sorted(alerts)} name missing runbook {rb_id!r}"
        assert runbooks[rb_id].kind is Kind.ALERT
        assert alerts <= set(runbooks[rb_id].alerts)
    problems = check_references(runbooks, alert_refs, ())
    assert not [p for p in problems if "not referenced" not in p]


def test_every_recovery_objective_runbook_resolves(runbooks, objective_refs) -> None:
    assert set(objective_refs) >= set(FAILURE_CLASSES)
    for rb_id in objective_refs:
        assert rb_id in runbooks and runbooks[rb_id].kind is Kind.FAILURE_CLASS, rb_id


def test_every_runbook_is_referenced_and_related_ids_exist(
    runbooks, alert_refs, objective_refs
) -> None:
    problems = check_references(runbooks, alert_refs, {}, objective_refs)
    assert problems == []


def test_expected_alerts_of_objectives_are_listed_by_their_runbook(runbooks) -> None:
    from slo.specs import load_specs

    for env in ENVIRONMENTS:
        for name, obj in load_specs(env).recovery_objectives.items():
            missing = set(obj.expected_alerts) - set(runbooks[obj.runbook].alerts)
            assert not missing, f"{env}/{name}: runbook {obj.runbook} does not list {missing}"


def test_experiments_reference_existing_failure_class_runbooks(
    runbooks, alert_refs, objective_refs
) -> None:
    if not EXPERIMENTS.is_dir():
        pytest.skip("chaos/experiments/ does not exist yet (experiments are being written)")
    refs = experiment_runbook_refs(EXPERIMENTS)
    problems = check_references(runbooks, alert_refs, refs, objective_refs)
    assert problems == []
    for rb in runbooks.values():
        if rb.kind is Kind.FAILURE_CLASS:
            assert (ROOT / rb.experiment).is_file(), f"{rb.path}: {rb.experiment} is missing"


# --- gameday commands in the Local environment blocks -------------------------------------


def _local_commands(runbooks) -> list[tuple[str, str]]:
    return sorted(
        {
            (rb.id, cmd)
            for rb in runbooks.values()
            for cmd in rb.gameday_commands("Local environment")
        }
    )


def _resolve(words: list[str]) -> tuple[list[str], click.Command, list[str]]:
    """Walk the click tree: (subcommand path, leaf command, remaining words)."""
    cmd: click.Command = main
    path: list[str] = []
    ctx = click.Context(main, info_name="gameday")
    rest = list(words)
    while isinstance(cmd, click.Group) and rest and not rest[0].startswith("-"):
        sub = cmd.get_command(ctx, rest[0])
        if sub is None:
            raise AssertionError(
                f"gameday {' '.join(path + rest[:1])}: no such subcommand "
                f"(known: {', '.join(cmd.list_commands(ctx))})"
            )
        path.append(rest.pop(0))
        cmd = sub
        ctx = click.Context(cmd, info_name=path[-1], parent=ctx)
    return path, cmd, rest


def test_local_blocks_name_gameday_commands(runbooks) -> None:
    commands = _local_commands(runbooks)
    assert len(commands) >= 20
    assert {rb.id for rb in runbooks.values()} == {rb_id for rb_id, _ in commands}


def test_every_local_gameday_command_is_a_real_subcommand(runbooks) -> None:
    runner = CliRunner()
    checked: set[tuple[str, ...]] = set()
    for rb_id, command in _local_commands(runbooks):
        words = shlex.split(command)[1:]
        path, leaf, rest = _resolve(words)
        assert not isinstance(leaf, click.Group), f"{rb_id}: `{command}` names a group only"
        if tuple(path) not in checked:
            result = runner.invoke(main, [*path, "--help"])
            assert result.exit_code == 0, (
                f"{rb_id}: gameday {' '.join(path)} --help: {result.output}"
            )
            checked.add(tuple(path))
        # the options and arguments parse (nothing runs): catches misspelled options
        try:
            leaf.make_context(path[-1], list(rest))
        except click.UsageError as exc:
            raise AssertionError(f"{rb_id}: `{command}`: {exc.format_message()}") from exc
    assert len(checked) >= 10


def test_command_checker_catches_bogus_commands() -> None:
    with pytest.raises(AssertionError, match="no such subcommand"):
        _resolve(["fault", "reboot-everything"])
    path, leaf, rest = _resolve(["fault", "artifact-store-unreachable", "--mode", "sideways"])
    assert path == ["fault", "artifact-store-unreachable"]
    with pytest.raises(click.UsageError):
        leaf.make_context(path[-1], rest)


# --- the loader and checker on broken input ---------------------------------------------

GOOD = """\
---
id: {id}
title: Example
kind: {kind}
alerts: [ExampleBurnRate]
slos: [queue-age]
{experiment}related: []
---

## Symptoms
s

## Confirm
c

## Decide
Fail closed when in doubt.

## Recover

### Local environment

```bash
gameday env status
```

### AWS / Kubernetes

```bash
kubectl -n mlp-controlplane get pods
```

## Verify
v

## Rehearse
chaos/experiments/{id}.yaml and `gameday run --experiment {id}`
"""


def _write(
    tmp_path: Path, rb_id: str, kind: str = "failure-class", text: str | None = None
) -> Path:
    experiment = f"experiment: chaos/experiments/{rb_id}.yaml\n" if kind == "failure-class" else ""
    path = tmp_path / f"{rb_id}.md"
    path.write_text(
        text if text is not None else GOOD.format(id=rb_id, kind=kind, experiment=experiment)
    )
    return path


def _problems(tmp_path: Path) -> list[str]:
    with pytest.raises(RunbookError) as exc:
        load_runbooks(tmp_path)
    return exc.value.problems


def test_loader_accepts_a_minimal_runbook(tmp_path: Path) -> None:
    _write(tmp_path, "example")
    (tmp_path / "README.md").write_text("# index, not a runbook\n")
    rbs = load_runbooks(tmp_path)
    assert list(rbs) == ["example"]
    assert rbs["example"].gameday_commands() == ["gameday env status"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda t: t.replace("---\nid", "id", 1), "front matter: missing"),
        (lambda t: t.replace("id: example", "id: other"), "id: 'other' differs from the file name"),
        (
            lambda t: t.replace("kind: failure-class", "kind: incident"),
            "kind: 'incident' is not one of",
        ),
        (lambda t: t.replace("title: Example\n", ""), "title: required field is missing"),
        (lambda t: t.replace("slos: [queue-age]", "slos: queue-age"), "slos: must be a list"),
        (
            lambda t: t.replace("related: []", "related: []\nowner: me"),
            "unknown field(s) ['owner']",
        ),
        (
            lambda t: t.replace("example.yaml\nrelated", "other.yaml\nrelated"),
            "experiment: a failure-class runbook must name 'chaos/experiments/example.yaml'",
        ),
        (lambda t: t.replace("## Verify\nv\n", ""), "section '## Verify': missing"),
        (
            lambda t: t.replace("### AWS / Kubernetes", "### AWS"),
            "subsection '### AWS / Kubernetes' missing",
        ),
        (lambda t: t.replace("Fail closed when in doubt.", "Think."), "names no fail-closed point"),
        (
            lambda t: t.replace("`gameday run --experiment example`", ""),
            "must contain 'gameday run --experiment example'",
        ),
        (
            lambda t: t.replace("alerts: [ExampleBurnRate]", "alerts: [ExampleBurnRate"),
            "front matter: not valid YAML",
        ),
    ],
)
def test_loader_names_file_and_field(tmp_path: Path, mutate, expected: str) -> None:
    path = _write(tmp_path, "example")
    path.write_text(mutate(path.read_text()))
    problems = _problems(tmp_path)
    assert any(expected in p and str(path) in p for p in problems), problems


def test_loader_reports_every_broken_file(tmp_path: Path) -> None:
    _write(tmp_path, "one", text="no front matter\n")
    _write(tmp_path, "two", text="---\n[1, 2]\n---\n")
    problems = _problems(tmp_path)
    assert len(problems) == 2
    assert "one.md: front matter: missing" in problems[0]
    assert "two.md: front matter: expected a mapping" in problems[1]


def test_headings_inside_code_blocks_are_not_sections(tmp_path: Path) -> None:
    path = _write(tmp_path, "example")
    path.write_text(path.read_text().replace("gameday env status", "# Verify\ngameday env status"))
    rb = load_runbooks(tmp_path)["example"]
    assert rb.sections["Verify"] == "v"


def test_check_references_reports_each_kind_of_break(tmp_path: Path) -> None:
    _write(tmp_path, "fc")
    _write(tmp_path, "alert-x", kind="alert")
    _write(tmp_path, "orphan", kind="alert")
    rbs = load_runbooks(tmp_path)
    problems = check_references(
        rbs,
        {
            "alert-x": {"ExampleBurnRate", "OtherBurnRate"},
            "fc": {"ExampleBurnRate"},
            "alert-missing": {"GoneBurnRate"},
        },
        {"fc": {"fc.yaml"}, "alert-x": {"x.yaml"}},
        {"db-gone": {"db-gone"}},
    )
    text = "\n".join(problems)
    assert "alerts: does not list ['OtherBurnRate']" in text
    assert "fc.md: kind: alerts link it, so it must be 'alert'" in text
    assert (
        "alert runbook annotation 'alert-missing' (alerts: GoneBurnRate): no runbooks/alert-missing.md"
        in text
    )
    assert (
        "alert-x.md: kind: referenced by experiment (x.yaml), so it must be 'failure-class'" in text
    )
    assert "recovery objective reference 'db-gone' (db-gone): no runbooks/db-gone.md" in text
    assert "orphan.md: not referenced by any alert, recovery objective or experiment" in text


def test_experiment_refs_use_file_names_and_runbook_keys(tmp_path: Path) -> None:
    (tmp_path / "db-primary-loss.yaml").write_text(
        textwrap.dedent("""\
        title: db
        extensions:
          - name: gameday
            runbook: runbooks/alert-api-availability-burn.md
        """)
    )
    (tmp_path / "db-restore-from-backup.yaml").write_text(
        "title: restore\nextensions:\n  - name: x-gameday\n    runbook: db-primary-loss\n"
    )
    (tmp_path / "registry-failure.yaml").write_text("title: no runbook key\n")
    refs = experiment_runbook_refs(tmp_path)
    # runbook keys name the runbooks; only an experiment without any falls back to its file name
    assert refs == {
        "alert-api-availability-burn": {"db-primary-loss.yaml"},
        "db-primary-loss": {"db-restore-from-backup.yaml"},
        "registry-failure": {"registry-failure.yaml"},
    }
