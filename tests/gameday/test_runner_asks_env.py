"""The runner asks the environment, never branches on its name (environments/base.py
EnvironmentKind and Environment): one list of env names, each kind answering what a game day
needs to know before and after it opens one. No environment is started here."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from environments.base import (
    ENVIRONMENTS,
    EnvironmentRefused,
    EnvironmentUnavailable,
    EvidenceNeeds,
    RunRequest,
    environment_kind,
)
from environments.cloud.env import CLOUD_ENVS, CloudEnvironment
from environments.local.env import LocalEnvironment
from gameday import collect, run_evidence
from gameday.options import Options
from gameday.preflight import preflight
from gameday.run import run_cmd
from gameday.suites import SuiteError
from slo.specs.model import ENVIRONMENTS as SPEC_ENVIRONMENTS
from tests.gameday.test_cloud_env import SECRETS, target, write

ROOT = Path(__file__).resolve().parents[2]
KIND_ANSWERS = ("refusal", "dry_run", "prometheus_url", "open_for_run")
ENV_ANSWERS = ("run_info", "chaos_env", "evidence_needs", "applicability", "status")


def test_the_runner_never_branches_on_an_env_name() -> None:
    pattern = re.compile(r"""CLOUD_ENVS|LOCAL_ENVS|\b(opts\.)?env\s*(==|!=|\bin\b|\bnot in\b)"""
                         r"""\s*[("'\[]""")
    hits = [f"{f.relative_to(ROOT)}:{n}: {line.strip()}" for f in sorted((ROOT / "gameday").glob("*.py"))
            for n, line in enumerate(f.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def test_one_list_of_environment_names() -> None:
    # the SLO specs exist per env: the same names, in the same order
    assert tuple(ENVIRONMENTS) == SPEC_ENVIRONMENTS
    assert CLOUD_ENVS == tuple(n for n, kind in ENVIRONMENTS.items() if kind == "cloud")
    (env_option,) = [p for p in run_cmd.params if p.name == "env"]
    assert list(env_option.type.choices) == list(ENVIRONMENTS)


def test_an_unknown_env_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentRefused, match=r"unknown env 'qa'; envs: local, dev, staging, prod$"):
        environment_kind("qa")
    with pytest.raises(SuiteError, match=r"unknown env 'qa'; envs: local, dev, staging, prod"):
        preflight(Options(env="qa", runs_dir=tmp_path / "runs", home=tmp_path))


@pytest.mark.parametrize("env", list(ENVIRONMENTS))
def test_every_kind_answers_what_the_runner_asks(env: str) -> None:
    kind = environment_kind(env)
    assert kind.budget_source in ("prometheus", "archive")
    assert isinstance(kind.durability_stream, bool) and isinstance(kind.sigterm_is_interrupt, bool)
    assert isinstance(kind.remote, bool)
    for name in KIND_ANSWERS + ENV_ANSWERS:
        assert hasattr(kind, name), f"{kind.__name__} lacks {name}"


def test_the_local_kind_answers_without_an_environment(tmp_path: Path) -> None:
    req = RunRequest(env="local", env_name="mine", home=tmp_path)
    assert LocalEnvironment.refusal(req) is None
    lines = list(LocalEnvironment.dry_run(req))
    assert len(lines) == 1 and "'mine'" in lines[0] and "not running (would be brought up)" in lines[0]
    with pytest.raises(EnvironmentUnavailable, match="local environment 'mine' is not running"):
        LocalEnvironment.prometheus_url(req)
    assert (LocalEnvironment.budget_source, LocalEnvironment.durability_stream) == ("archive", True)


def test_the_cloud_kind_refuses_before_touching_anything(tmp_path: Path) -> None:
    assert "needs an explicit --target" in CloudEnvironment.refusal(RunRequest(env="staging"))
    prod = RunRequest(env="prod", target=tmp_path / "t.json")
    assert "without --allow-prod" in CloudEnvironment.refusal(prod)
    bad = RunRequest(env="staging", target=write(tmp_path, target(prometheusUrl=None)))
    lines = CloudEnvironment.dry_run(bad)
    assert next(lines).startswith("target: ")
    with pytest.raises(EnvironmentUnavailable, match="key 'prometheusUrl' is required"):
        next(lines)
    with pytest.raises(EnvironmentUnavailable, match="no Prometheus URL: .*prometheusUrl"):
        CloudEnvironment.prometheus_url(bad)
    calls: list[str] = []
    req = RunRequest(env="staging", target=write(tmp_path, target()), platform="prefect")
    with pytest.raises(EnvironmentRefused, match="platform 'prefect' has no cloud deployment"), \
            CloudEnvironment.open_for_run(req, lambda: calls.append("run") or ("id", tmp_path),
                                          calls.append):
        pass
    assert calls == [] and not (tmp_path / ".gameday").exists()


def test_the_cloud_environment_says_what_chaos_and_the_evidence_need(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    env = CloudEnvironment.from_target(write(tmp_path, target()), "staging", home=tmp_path)
    assert env.remote and env.chaos_env() == {
        "GAMEDAY_TARGET": str((tmp_path / "target.json").resolve()),
        "GAMEDAY_CLOUD_STATE_DIR": str(env.state_dir), "GAMEDAY_ALLOW_PROD": "false"}
    needs = env.evidence_needs
    # its own query for the API's requests (no HAProxy there), the rest as the runner's
    assert set(needs.queries) == {"api_requests"} and needs.known_gaps
    assert "controlplane_http_requests_total" in str(needs.queries["api_requests"])
    assert needs.aws_objects == ("mlplatform-staging-artifacts", "eu-west-1")
    local = LocalEnvironment("mine", tmp_path)
    assert not local.remote and local.chaos_env() == {} and local.run_info() == {}
    assert local.evidence_needs == EvidenceNeeds()


class _Env:
    name = "fake"

    def __init__(self, tmp_path: Path, needs: EvidenceNeeds) -> None:
        self.evidence_needs = needs
        self.endpoints = {"fault_timeline": str(tmp_path / "faults.jsonl"),
                          "prometheus": "http://127.0.0.1:1"}


def _collect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, needs: EvidenceNeeds,
             rollback: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    queried: dict[str, str] = {}
    monkeypatch.setattr(collect, "merge_ledgers", lambda run_dir: 3)
    monkeypatch.setattr(collect, "copy_faults", lambda src, run_dir, since: 2)
    monkeypatch.setattr(collect, "query_prometheus",
                        lambda url, run_dir, a, b, queries: queried.update(queries) or {})

    def snapshot(adapter: Any, run_dir: Path, since: Any) -> dict[str, Any]:
        raise RuntimeError("store unreachable")

    monkeypatch.setattr(collect, "snapshot", snapshot)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ev = run_evidence.collect_evidence(_Env(tmp_path, needs), None, run_dir, datetime.now(UTC),
                                       rollback, None, Console(record=True))
    assert (ev.ledger_entries, ev.fault_events) == (3, 2)
    return ev.snapshot, queried


def test_evidence_is_collected_as_the_environment_needs(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # local: everything collected, no gaps file, the snapshot's counts as they came
    counts, queried = _collect(tmp_path, monkeypatch, EvidenceNeeds(), {"error": "boom"})
    assert "api_requests" in queried and counts == {"error": "store unreachable"}
    assert not (tmp_path / "run" / "collection-gaps.json").exists()
    # cloud-like: every gap is written down, with why
    needs = EvidenceNeeds(queries={"api_requests": None, "alerts": "ALERTS{env='qa'}"},
                          known_gaps={"component logs": "not copied"}, snapshot_source="the DSN",
                          aws_objects=("bucket", "eu-west-1"), active_faults_at="state.json")
    (tmp_path / "run").rename(tmp_path / "run-local")
    counts, queried = _collect(tmp_path, monkeypatch, needs, {"error": "boom"})
    # a metric missing there is not queried; one it names otherwise is asked its way
    assert "api_requests" not in queried and queried["alerts"] == "ALERTS{env='qa'}"
    assert queried["queue_age"] == run_evidence.PROM_QUERIES["queue_age"]
    gaps = json.loads((tmp_path / "run" / "collection-gaps.json").read_text())
    assert gaps["component logs"] == "not copied"
    assert gaps["snapshot/"] == "the store snapshot failed (the DSN): store unreachable"
    assert gaps["rollback"] == "restore_all failed: boom; the faults still active are in state.json"
    assert counts["rollback"] == {"error": "boom"}
