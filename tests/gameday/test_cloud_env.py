"""The cloud environment facade (environments/cloud/env.py), the timeline-recording cloud driver
(environments/cloud/recorded.py) and the run guards of cloud game days. No AWS or EKS here: Kubernetes
is the hand-written stub of tests/chaos/fake_kube.py (recorded EKS objects), AWS is not called."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from chaos.context import CLOUD_STATE_ENV, CLOUD_TARGET_ENV, ChaosError, Context
from environments.cloud.env import CloudEnvError, CloudEnvironment, CloudTargetFile
from gameday.cli import main
from gameday.run import EXIT_REFUSED
from tests.chaos.fake_kube import FakeCluster

SECRETS = {"GAMEDAY_ADMIN_DSN": "postgresql://gameday:s3cret-dsn@db/controlplane",
           "GAMEDAY_PROJECT_TOKEN": "s3cret-project-token", "GAMEDAY_AGENT_TOKEN": "s3cret-agent"}


def target(**over: Any) -> dict[str, Any]:
    doc = {"environment": "staging", "region": "eu-west-1", "project": "mlplatform",
           "stack": "staging", "artifactBucket": "mlplatform-staging-artifacts",
           "apiUrl": "http://controlplane-api.mlp-controlplane.svc:8080",
           "prometheusUrl": "http://prometheus.monitoring.svc:9090",
           "workloadImage": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/trainer:1.0"}
    doc.update(over)
    return {k: v for k, v in doc.items() if v is not None}


def write(tmp_path: Path, doc: Any, name: str = "target.json") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    return SECRETS


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(var, "testing")


# -- the target file ------------------------------------------------------------------------------
@pytest.mark.parametrize("doc, expected", [
    ("{not json", "not valid JSON"),
    ("[]", "a JSON object is expected, got list"),
    (target(apiUrl=None), "key 'apiUrl' is required"),
    (target(prometheusUrl=None), "key 'prometheusUrl' is required"),
    (target(workloadImage=""), "key 'workloadImage' is required"),
    (target(apiUrl="controlplane-api:8080"), "key 'apiUrl': 'controlplane-api:8080' is not an http"),
    (target(adminDsnEnv="not a var"), "key 'adminDsnEnv' must name an environment variable"),
    (target(leaseSeconds=5), "key 'leaseSeconds' must be an integer in \\[30, 3600\\]"),
    (target(region=None), "region is required"),
    (target(vpcId="vpc-1"), "unknown key\\(s\\) \\['vpcId'\\]"),
    (target(environment="dev"), "key 'environment' is 'dev' but --env is 'staging'"),
])
def test_cloud_target_file_errors_name_file_and_key_no_cloud_needed(
        tmp_path: Path, doc: Any, expected: str) -> None:
    path = write(tmp_path, doc)
    with pytest.raises(CloudEnvError, match=expected) as info:
        CloudTargetFile.load(path, "staging")
    assert str(path) in str(info.value)


def test_cloud_target_file_missing_is_named(tmp_path: Path) -> None:
    with pytest.raises(CloudEnvError, match="target file .*nope.json: cannot read it"):
        CloudTargetFile.load(tmp_path / "nope.json", "staging")


def test_cloud_env_missing_secret_names_the_variable_never_a_value(
        tmp_path: Path, secrets: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GAMEDAY_AGENT_TOKEN")
    with pytest.raises(CloudEnvError, match="GAMEDAY_AGENT_TOKEN \\(target key 'agentTokenEnv'") as info:
        CloudEnvironment.from_target(write(tmp_path, target()), "staging", home=tmp_path)
    assert not any(v in str(info.value) for v in SECRETS.values())


def test_cloud_env_secret_variable_names_come_from_the_target(
        tmp_path: Path, secrets: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_DSN", "postgresql://other")
    env = CloudEnvironment.from_target(write(tmp_path, target(adminDsnEnv="MY_DSN")), "staging",
                                       home=tmp_path)
    assert env.endpoints["dsn"] == "postgresql://other"


def test_cloud_env_prod_needs_allow_prod(tmp_path: Path, secrets: dict[str, str]) -> None:
    path = write(tmp_path, target(environment="prod", stack="prod"))
    with pytest.raises(CloudEnvError, match="prod without --allow-prod"):
        CloudEnvironment.from_target(path, "prod", home=tmp_path)
    assert CloudEnvironment.from_target(path, "prod", home=tmp_path, allow_prod=True).name == "prod"


def test_cloud_env_offers_what_the_runner_and_chaos_layer_use(
        tmp_path: Path, secrets: dict[str, str]) -> None:
    env = CloudEnvironment.from_target(write(tmp_path, target()), "staging", home=tmp_path)
    assert env.state_dir == tmp_path.resolve() / ".gameday" / "cloud" / "staging"
    eps = env.endpoints
    assert eps["api"] == "http://controlplane-api.mlp-controlplane.svc:8080"
    assert eps["fault_timeline"] == str(env.state_dir / "faults.jsonl")
    assert eps["image"].endswith("/trainer:1.0") and "s3" not in eps
    assert env.tokens == {"projects": {"gameday": "s3cret-project-token"}, "agent": "s3cret-agent"}
    assert [(a.name, a.pool, a.region) for a in env.agents] == [
        ("mlplatform-staging-cpu", "cpu", "eu-west-1"), ("mlplatform-staging-gpu", "gpu", "eu-west-1")]
    assert env.applicability("ineligible-fallback-region")
    assert env.applicability("api-replica-loss") is None
    # what goes into run.json names the target, never a credential
    described = json.dumps(env.describe())
    assert not any(v in described for v in SECRETS.values())


# -- the fault timeline of cloud faults -------------------------------------------------------------
def test_cloud_faults_record_the_timeline_against_stubbed_kubernetes_api(
        tmp_path: Path, secrets: dict[str, str], fake_cluster: FakeCluster) -> None:
    env = CloudEnvironment.from_target(write(tmp_path, target()), "staging", home=tmp_path)
    d = env.driver
    d.kill("api-1")
    d.kill("api-1")  # still open: recorded once
    d.start("api-1")
    d.stop("reconciler")
    env.note("failover", {"automation": "failover"})
    assert list(d.active()) == ["stop:controlplane-reconciler"]
    assert d.restore_all() == ["stop:controlplane-reconciler"]
    rows = [json.loads(x) for x in env.timeline_file.read_text().splitlines()]
    assert [(r["event"], r["fault"], r["target"]) for r in rows] == [
        ("fault_start", "kill", "api-1"), ("fault_end", "kill", "api-1"),
        ("fault_start", "stop", "reconciler"), ("note", "failover", "staging"),
        ("fault_end", "stop", "reconciler")]
    assert rows[-1]["details"] == {"restored_by": "restore_all"}
    assert [(v, k) for v, k, _ in fake_cluster.writes] == [
        ("delete", "pod"), ("patch", "deployment"), ("patch", "deployment")]
    reconciler = fake_cluster.objects["deployments"][("mlp-controlplane", "controlplane-reconciler")]
    assert reconciler["spec"]["replicas"] == 1  # scaled back by the rollback


def test_cloud_failed_injection_closes_its_window_against_stubbed_kubernetes_api(
        tmp_path: Path, secrets: dict[str, str], fake_cluster: FakeCluster) -> None:
    env = CloudEnvironment.from_target(write(tmp_path, target()), "staging", home=tmp_path)
    with pytest.raises(Exception, match="unknown target"):
        env.driver.kill("nonsense")
    rows = [json.loads(x) for x in env.timeline_file.read_text().splitlines()]
    assert [(r["event"], r["fault"]) for r in rows] == [("fault_start", "kill"), ("fault_end", "kill")]
    assert "unknown target" in rows[1]["details"]["error"]
    assert env.driver.open_faults() == []


# -- chaos.context picks the environment ------------------------------------------------------------
def test_context_uses_the_cloud_facade_only_with_a_target(
        tmp_path: Path, secrets: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        fake_cluster: FakeCluster) -> None:
    path = write(tmp_path, target())
    monkeypatch.setenv(CLOUD_TARGET_ENV, str(path))
    monkeypatch.setenv(CLOUD_STATE_ENV, str(tmp_path / "state"))
    ctx = Context.from_configuration({"gameday_env": "staging", "gameday_run_dir": str(tmp_path)})
    assert isinstance(ctx.env, CloudEnvironment) and ctx.env.state_dir == tmp_path / "state"
    assert ctx.driver is ctx.env.driver and ctx.driver.name == "kubernetes+aws"
    assert ctx.platform.api_url == "http://controlplane-api.mlp-controlplane.svc:8080"
    # a target for another env is an error the journal records, not a silent local fallback
    ctx = Context.from_configuration({"gameday_env": "dev"})
    with pytest.raises(ChaosError, match="'staging' but --env is 'dev'"):
        _ = ctx.env
    monkeypatch.delenv(CLOUD_TARGET_ENV)
    ctx = Context.from_configuration({"gameday_env": "local", "gameday_home": str(tmp_path)})
    with pytest.raises(ChaosError, match="has no state at"):  # without a target: local
        _ = ctx.env


# -- run guards --------------------------------------------------------------------------------------
def _run(*args: str, home: Path, extra: dict[str, str] | None = None) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args), env={"GAMEDAY_HOME": str(home), **(extra or {})})
    return r.exit_code, " ".join(r.output.split())  # rich wraps long lines


def test_cloud_run_without_target_is_refused_naming_it(tmp_path: Path) -> None:
    code, out = _run("gate", "--env", "staging", "--freeze-file", str(tmp_path / "none.yaml"),
                     home=tmp_path)
    assert code == EXIT_REFUSED and "needs an explicit --target" in out


def test_cloud_prod_run_without_allow_prod_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, target(environment="prod", stack="prod"))
    code, out = _run("run", "--env", "prod", "--target", str(path), "--freeze-file",
                     str(tmp_path / "none.yaml"), home=tmp_path, extra=SECRETS)
    assert code == EXIT_REFUSED and "without --allow-prod" in out
    assert not (tmp_path / ".gameday").exists()


def test_cloud_run_with_a_bad_target_is_refused_before_anything_is_touched(tmp_path: Path) -> None:
    path = write(tmp_path, target(prometheusUrl=None))
    code, out = _run("gate", "--env", "staging", "--target", str(path), "--runs-dir",
                     str(tmp_path / "runs"), "--freeze-file", str(tmp_path / "none.yaml"),
                     home=tmp_path, extra=SECRETS)
    assert code == EXIT_REFUSED and "key 'prometheusUrl' is required" in out
    assert not (tmp_path / "runs").exists()


def test_cloud_run_without_credentials_is_refused_naming_the_variable(tmp_path: Path) -> None:
    path = write(tmp_path, target())
    code, out = _run("gate", "--env", "staging", "--target", str(path), "--freeze-file",
                     str(tmp_path / "none.yaml"), home=tmp_path,
                     extra={"GAMEDAY_PROJECT_TOKEN": "x", "GAMEDAY_AGENT_TOKEN": "y"})
    assert code == EXIT_REFUSED and "GAMEDAY_ADMIN_DSN" in out


def test_cloud_dry_run_shows_the_target_and_changes_nothing(tmp_path: Path) -> None:
    path = write(tmp_path, target())
    code, out = _run("run", "--env", "staging", "--target", str(path), "--dry-run", "--freeze-file",
                     str(tmp_path / "none.yaml"), home=tmp_path)
    assert code == 0, out
    assert "http://controlplane-api.mlp-controlplane.svc:8080" in out and "GAMEDAY_ADMIN_DSN" in out
    assert "Lease gameday-lock" in out and "nothing was changed" in out
    assert not (tmp_path / ".gameday").exists()
