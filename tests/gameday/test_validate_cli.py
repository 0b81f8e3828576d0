"""`gameday run`/`gate` validate every experiment of the suite in preflight: a broken one is
refused (exit 4) with every problem printed, before any environment exists; `gameday validate`
checks experiments on their own."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from environments.local.env import LocalEnvironment
from gameday import suites
from gameday.cli import main
from gameday.run import EXIT_REFUSED


def _run(*args: str, home: Path) -> tuple[int, str]:
    # wide enough that Rich does not wrap a problem line in the middle
    r = CliRunner().invoke(main, list(args), env={"GAMEDAY_HOME": str(home), "COLUMNS": "400"})
    return r.exit_code, r.output


@pytest.fixture
def experiments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shipped experiments the suites read from, free to break."""
    copy = tmp_path / "experiments"
    shutil.copytree(suites.EXPERIMENT_DIR, copy)
    monkeypatch.setattr(suites, "EXPERIMENT_DIR", copy)

    def up(*args: object, **kwargs: object) -> None:
        raise AssertionError("the environment was touched")

    monkeypatch.setattr(LocalEnvironment, "up", up)
    return copy


def _break(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} does not match {path.name} once"
    path.write_text(text.replace(old, new))


def test_a_broken_experiment_is_refused_before_any_environment(tmp_path: Path,
                                                               experiments: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    broken = experiments / "broken-copy.yaml"
    shutil.copy(experiments / "api-replica-loss.yaml", broken)
    _break(broken, "func: kill,", "func: kil,")
    code, out = _run("run", "--experiment", "broken-copy", "--runs-dir", str(tmp_path / "runs"),
                     home=home)
    assert code == EXIT_REFUSED, out
    assert "refused" in out and "nothing was started" in out
    assert f"{broken}: method[2].provider.func: chaos.actions has no function 'kil'" in out
    assert not (home / ".gameday").exists() and not (tmp_path / "runs").exists()


def test_gate_prints_every_problem_of_the_suite(tmp_path: Path, experiments: Path) -> None:
    _break(experiments / "db-primary-loss.yaml", "{writable_within: 45}", "{within: 45}")
    _break(experiments / "agent-connectivity-loss.yaml", "runbook: agent-connectivity-loss",
           "runbook: agent-lost")
    code, out = _run("gate", "--suite", "ci", home=tmp_path)
    assert code == EXIT_REFUSED, out
    # Chaos Toolkit's own message for the first, ours for each defect
    assert "3 problem(s) in the experiments" in out
    assert "db-primary-loss.yaml: (chaostoolkit): argument 'within' is not part of" in out
    assert "db-primary-loss.yaml: method[1].provider.arguments.within: " in out
    assert "agent-connectivity-loss.yaml: extensions[0].runbook: runbooks/agent-lost.md" in out
    assert not (tmp_path / ".gameday").exists()


def test_dry_run_validates_too(tmp_path: Path, experiments: Path) -> None:
    code, out = _run("run", "--suite", "ci", "--dry-run", home=tmp_path)
    assert code == 0 and "validated 3 experiments" in out, out
    _break(experiments / "api-replica-loss.yaml", "recovery_objective: api-replica-loss",
           "recovery_objective: api-lost")
    code, out = _run("run", "--suite", "ci", "--dry-run", home=tmp_path)
    assert code == EXIT_REFUSED and "no RecoveryObjective 'api-lost'" in out, out
    assert "nothing was changed" not in out


def test_validate_command(tmp_path: Path, experiments: Path) -> None:
    code, out = _run("validate", home=tmp_path)
    assert code == 0 and f"validated {len(list(experiments.glob('*.yaml')))} experiments" in out
    code, out = _run("validate", "--suite", "ci", home=tmp_path)
    assert code == 0 and "validated 3 experiments: no problems" in out, out
    bad = tmp_path / "bad.yaml"
    bad.write_text("title: [unclosed\n")
    code, out = _run("validate", str(bad), str(experiments / "db-primary-loss.yaml"),
                     home=tmp_path)
    assert code == 1 and f"{bad}: line 2, column 1: invalid YAML" in out, out
    assert "1 problem(s) in 2 experiment(s)" in out
    code, out = _run("validate", "--suite", "ci", str(bad), home=tmp_path)
    assert code == 2 and "not both" in out
