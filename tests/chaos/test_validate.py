"""chaos/validate.py: every shipped experiment is runnable; a broken copy is refused with one
problem per defect, each naming the file and the field."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from chaos.validate import binding_problems, shown, validate_experiment
from gameday.suites import EXPERIMENT_DIR

SHIPPED = sorted(EXPERIMENT_DIR.glob("*.yaml"))


def broken_copy(tmp_path: Path, source: str, *edits: tuple[str, str]) -> Path:
    """A copy of a shipped experiment with each (old, new) text edit applied once."""
    text = (EXPERIMENT_DIR / f"{source}.yaml").read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"edit {old!r} no longer matches {source}.yaml once"
        text = text.replace(old, new)
    path = tmp_path / f"broken-{source}.yaml"
    path.write_text(text)
    return path


def test_there_are_experiments_to_check() -> None:
    assert len(SHIPPED) >= 10


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_experiment_validates_clean(path: Path) -> None:
    assert validate_experiment(path) == []


def case(name: str, source: str, edits: list[tuple[str, str]], expected: str) -> object:
    return pytest.param(source, edits, expected, id=name)


BROKEN = [
    case("wrong func", "db-primary-loss",
         [("func: crash_database_primary,", "func: crash_database_primry,")],
         "method[1].provider.func: chaos.actions has no function 'crash_database_primry' "
         "(did you mean 'crash_database_primary'?)"),
    case("unknown argument", "db-primary-loss",
         [("{writable_within: 45}", "{writable_in: 45}")],
         "method[1].provider.arguments.writable_in: chaos.actions.crash_database_primary has "
         "no argument 'writable_in'"),
    case("missing argument", "api-replica-loss",
         [("func: kill, arguments: {target: api-replica}", "func: kill")],
         "method[2].provider.arguments: missing argument 'target' of chaos.actions.kill"),
    case("unknown module", "db-primary-loss",
         [("module: chaos.probes, func: database_writable",
           "module: chaos.probez, func: database_writable")],
         "steady-state-hypothesis.probes[2].provider.module: cannot import 'chaos.probez'"),
    case("wrong rollback func", "db-primary-loss",
         [("func: restore_all}", "func: restore_al}")],
         "rollbacks[0].provider.func: chaos.actions has no function 'restore_al'"),
    case("argument Chaos Toolkit passes", "api-replica-loss",
         [("func: kill, arguments: {target: api-replica}}",
           "func: kill, arguments: {target: api-1, secrets: {}}}")],
         "method[2].provider.arguments.secrets: Chaos Toolkit passes this itself"),
    case("unknown recovery objective", "db-primary-loss",
         [("recovery_objective: db-primary-loss", "recovery_objective: db-primary-lost")],
         "extensions[0].recovery_objective: no RecoveryObjective 'db-primary-lost' in slo/specs"),
    case("missing runbook file", "db-primary-loss",
         [("runbook: db-primary-loss", "runbook: db-primary-los")],
         "extensions[0].runbook: runbooks/db-primary-los.md does not exist"),
    case("no blast radius", "api-replica-loss", [('blast_radius: "', 'blast: "')],
         "extensions[0].blast_radius: missing"),
    case("no x-gameday", "api-replica-loss", [("name: x-gameday", "name: x-other")],
         "extensions: no 'x-gameday' extension"),
    case("Chaos Toolkit's own rule", "api-replica-loss", [('title: "', 'heading: "')],
         "(chaostoolkit): experiment requires a title"),
    case("unknown SLO", "api-replica-loss",
         [("slos: [api-availability, submission-durability]",
           "slos: [api-availability, submission-durabilty]")],
         "extensions[0].slos[1]: no SLO 'submission-durabilty'"),
    case("unknown invariant", "db-unreachable-from-api-replica",
         [("invariants: [served-after-detection]", "invariants: [served-after-detecton]")],
         "extensions[0].invariants[0]: no invariant 'served-after-detecton'"),
]


@pytest.mark.parametrize(("source", "edits", "expected"), BROKEN)
def test_a_broken_copy_is_refused_naming_file_and_field(
        tmp_path: Path, source: str, edits: list[tuple[str, str]], expected: str) -> None:
    path = broken_copy(tmp_path, source, *edits)
    problems = validate_experiment(path)
    assert f"{path}: {expected}" in "\n".join(problems), problems
    assert all(p.startswith(f"{path}: ") for p in problems)


def test_bad_yaml_names_its_line(tmp_path: Path) -> None:
    path = broken_copy(tmp_path, "db-primary-loss", ("tags: [gameday, db-primary-loss]",
                                                     "tags: [gameday, db-primary-loss"))
    [problem] = validate_experiment(path)
    assert re.fullmatch(rf"{re.escape(str(path))}: line \d+, column \d+: invalid YAML: .*flow "
                        r"sequence at line 5.*", problem), problem


def test_every_problem_at_once(tmp_path: Path) -> None:
    # Chaos Toolkit stops at its first problem; the validator reports each one
    path = broken_copy(tmp_path, "db-primary-loss",
                       ("func: crash_database_primary,", "func: crash,"),
                       ("{tag: work, states: succeeded, timeout: 120}", "{tag: work, tmeout: 1}"),
                       ("recovery_objective: db-primary-loss", "recovery_objective: nope"))
    fields = [p.split(": ")[1] for p in validate_experiment(path)]
    assert {"method[1].provider.func", "method[3].provider.arguments.tmeout",
            "extensions[0].recovery_objective"} <= set(fields), fields


def test_an_experiment_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- just\n- a list\n")
    expected = f"{path}: (top level): an experiment is a mapping, not list"
    assert validate_experiment(path) == [expected]


def test_repository_files_are_named_from_the_repository_root() -> None:
    name = "chaos/experiments/db-primary-loss.yaml"
    assert shown(EXPERIMENT_DIR / "db-primary-loss.yaml") == name


def _action(tag: str, count: int = 1, *, configuration: dict | None = None,
            secrets: dict | None = None) -> None:
    """A provider as Chaos Toolkit expects it."""


def _no_secrets(tag: str, configuration: dict | None = None) -> None:
    """A provider that forgot the secrets keyword."""


def test_binding_names_every_unknown_and_missing_argument() -> None:
    sig = inspect.signature(_action)
    assert binding_problems(sig, {"tag": "a", "count": 2}, "m.f") == []
    assert binding_problems(sig, {"cout": 2, "size": 1}, "m.f") == [
        ("cout", "m.f has no argument 'cout' (it takes: tag, count)"),
        ("size", "m.f has no argument 'size' (it takes: tag, count)"),
        ("", "missing argument 'tag' of m.f (it has no default)"),
    ]
    assert binding_problems(inspect.signature(_no_secrets), {"tag": "a"}, "m.g") == [
        ("", "m.g takes no 'secrets' keyword (Chaos Toolkit passes it to providers)")]
