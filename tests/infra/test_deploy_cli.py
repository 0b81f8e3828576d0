"""`gameday infra image|deploy` (operations/deploy.py) against a real moto server: the archive
lands in the source bucket, a build starts on the right project with the right source
override. moto's CodeBuild reports every build SUCCEEDED at once and never exports variables,
so the phase progress, the exported digests and the failure path replay recorded
`BatchGetBuilds` responses (tests/infra/data/codebuild/, validated against botocore's model).
`--local` runs against a fake `docker` on PATH (no engine here)."""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.awsrequest import AWSResponse
from botocore.validate import validate_parameters
from click.testing import CliRunner, Result

from operations import cli, deploy
from tests.infra.harness import REPO
from tests.infra.motoserver import fresh_session

DATA = Path(__file__).parent / "data" / "codebuild"
REGION = "eu-west-1"
ACCOUNT = "123456789012"  # moto's default account
BUCKET = "mlplatform-staging-runner-source"
IMAGE, DEPLOY = "mlplatform-staging-image", "mlplatform-staging-deploy"
LOGS = "/aws/codebuild/mlplatform-staging-deploy-runner"
REGISTRY = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com"
REPOS = {"controlplane": f"{REGISTRY}/mlplatform-staging/controlplane",
         "gameday": f"{REGISTRY}/mlplatform-staging/gameday",
         "workloads/trainer": f"{REGISTRY}/mlplatform-staging/workloads/trainer"}
CP, GD = "sha256:" + "1" * 64, "sha256:" + "2" * 64


class Recorder:
    """The parameters each API call was sent with (botocore's provide-client-params event),
    and optional replayed BatchGetBuilds responses."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.replay: list[dict[str, Any]] = []
        self.interrupt = False  # Ctrl-C while polling

    def record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.calls.append((model.name, copy.deepcopy(params)))

    def batch_get_builds(self, params: dict[str, Any], **_: Any) -> Any:
        if self.interrupt:
            raise KeyboardInterrupt
        if not self.replay:
            return None  # ask moto
        build_id = json.loads(params["body"])["ids"][0]  # the serialized request
        body = json.loads(json.dumps(self.replay.pop(0)).replace("BUILD_ID", build_id))
        return AWSResponse(None, 200, {}, None), body

    def sent(self, operation: str) -> list[dict[str, Any]]:
        return [p for name, p in self.calls if name == operation]


@pytest.fixture()
def aws(moto: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    session = fresh_session(moto, monkeypatch, REGION)
    recorder = Recorder()
    session.events.register("provide-client-params.*.*", recorder.record)
    session.events.register("before-call.codebuild.BatchGetBuilds", recorder.batch_get_builds)
    monkeypatch.setattr(cli, "_session", lambda region: session)
    s3, codebuild = session.client("s3"), session.client("codebuild")
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    for name in (IMAGE, DEPLOY):
        codebuild.create_project(
            name=name, source={"type": "S3", "location": f"{BUCKET}/source/latest.zip"},
            artifacts={"type": "NO_ARTIFACTS"},
            environment={"type": "LINUX_CONTAINER", "image": "aws/codebuild/standard:7.0",
                         "computeType": "BUILD_GENERAL1_SMALL"},
            serviceRole=f"arn:aws:iam::{ACCOUNT}:role/{name}")
    recorder.calls.clear()
    yield recorder


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@x",
                           *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "checkout"
    repo.mkdir()
    (repo / "Dockerfile").write_text("FROM scratch AS controlplane\nFROM scratch AS gameday\n")
    (repo / "Pulumi.staging-app.yaml").write_text(
        f"config:\n  mlplatform:images:\n    controlplane: {CP}\n    gameday: {GD}\n")
    (repo / "notes.txt").write_text("committed\n")
    for stack in ("staging", "dev"):  # which images each builds (`--local`: stack_targets)
        (repo / f"Pulumi.{stack}.yaml").write_text((REPO / f"Pulumi.{stack}.yaml").read_text())
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "x")
    (repo / "untracked.txt").write_text("never archived\n")
    return repo


@pytest.fixture()
def outputs(tmp_path: Path) -> Path:
    path = tmp_path / "staging-outputs.json"
    path.write_text(json.dumps({
        "clusterName": "mlplatform-staging", "repositories": REPOS,
        "deployRunner": {"imageProject": IMAGE, "deployProject": DEPLOY, "sourceBucket": BUCKET,
                         "roleArn": f"arn:aws:iam::{ACCOUNT}:role/runner-deploy",
                         "logGroup": LOGS, "region": REGION, "appStack": "staging-app"}}))
    return path


def _run(*args: str) -> Result:
    return CliRunner().invoke(cli.infra_group, list(args), catch_exceptions=False)


def _archive(key: str) -> dict[str, bytes]:
    body = boto3.client("s3", region_name=REGION).get_object(Bucket=BUCKET, Key=key)["Body"].read()
    with zipfile.ZipFile(io.BytesIO(body)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _replay(name: str) -> list[dict[str, Any]]:
    return json.loads((DATA / name).read_text())


# --- against moto --------------------------------------------------------------------------

def test_deploy_uploads_the_checkout_and_starts_the_deploy_project(
        aws: Recorder, checkout: Path, outputs: Path) -> None:
    result = _run("deploy", "--stack", "staging", "--outputs", str(outputs), "--image-digest",
                  f"controlplane={CP}", "--poll-seconds", "0", "--work-dir", str(checkout))
    assert result.exit_code == 0, result.output
    commit = _git(checkout, "rev-parse", "--short=12", "HEAD")
    keys = [o["Key"] for o in boto3.client("s3", region_name=REGION)
            .list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert len(keys) == 1 and keys[0].startswith(f"source/staging/{commit}-")
    files = _archive(keys[0])
    assert files["notes.txt"] == b"committed\n" and "untracked.txt" not in files
    [sent] = aws.sent("StartBuild")
    assert sent["projectName"] == DEPLOY
    assert sent["sourceTypeOverride"] == "S3"
    assert sent["sourceLocationOverride"] == f"{BUCKET}/{keys[0]}"
    assert sent["environmentVariablesOverride"] == [
        {"name": "IMAGE_DIGEST_CONTROLPLANE", "value": CP, "type": "PLAINTEXT"},
        {"name": "SOURCE_REVISION", "value": commit, "type": "PLAINTEXT"}]
    # moto kept the build under the deploy project, none under the image project
    codebuild = boto3.client("codebuild", region_name=REGION)
    assert len(codebuild.list_builds_for_project(projectName=DEPLOY)["ids"]) == 1
    assert codebuild.list_builds_for_project(projectName=IMAGE)["ids"] == []
    assert "COMPLETED  (SUCCEEDED)" in result.output
    assert "stack staging-app: deployed" in result.output


def test_deploy_takes_the_digests_from_the_app_stack_config(
        aws: Recorder, checkout: Path, outputs: Path) -> None:
    result = _run("deploy", "--stack", "staging", "--outputs", str(outputs),
                  "--poll-seconds", "0", "--work-dir", str(checkout))
    assert result.exit_code == 0, result.output
    variables = {v["name"]: v["value"] for v in aws.sent("StartBuild")[0]["environmentVariablesOverride"]}
    assert (variables["IMAGE_DIGEST_CONTROLPLANE"], variables["IMAGE_DIGEST_GAMEDAY"]) == (CP, GD)


def test_dirty_tree_is_refused_unless_allowed(aws: Recorder, checkout: Path, outputs: Path) -> None:
    (checkout / "notes.txt").write_text("changed, not committed\n")
    args = ["deploy", "--stack", "staging", "--outputs", str(outputs), "--poll-seconds", "0",
            "--work-dir", str(checkout)]
    refused = _run(*args)
    assert refused.exit_code == 1
    assert "uncommitted changes (notes.txt)" in refused.output and "--allow-dirty" in refused.output
    assert aws.sent("StartBuild") == [] and aws.sent("PutObject") == []
    allowed = _run(*args, "--allow-dirty")
    assert allowed.exit_code == 0, allowed.output
    key = aws.sent("PutObject")[0]["Key"]
    assert "-dirty-" in key
    assert _archive(key)["notes.txt"] == b"changed, not committed\n"
    assert _git(checkout, "stash", "list") == "", "the operator's stash is left alone"


def test_image_fails_clearly_when_the_build_exports_no_digest(
        aws: Recorder, checkout: Path, outputs: Path) -> None:
    """What moto's CodeBuild gives: SUCCEEDED, no exported variables."""
    result = _run("image", "--stack", "staging", "--outputs", str(outputs), "--no-set-config",
                  "--poll-seconds", "0", "--work-dir", str(checkout))
    assert result.exit_code == 1
    assert "succeeded but exported no IMAGE_DIGEST_CONTROLPLANE" in result.output
    assert aws.sent("StartBuild")[0]["projectName"] == IMAGE


# --- recorded BatchGetBuilds responses --------------------------------------------------------

@pytest.mark.parametrize("name", ["image_succeeded.json", "deploy_failed.json"])
def test_recorded_responses_match_the_service_model(name: str) -> None:
    shape = boto3.client("codebuild", region_name=REGION).meta.service_model \
        .operation_model("BatchGetBuilds").output_shape
    for response in _replay(name):
        validate_parameters(response, shape)  # raises ParamValidationError on any mismatch


def test_image_prints_progress_and_sets_the_digests(
        aws: Recorder, checkout: Path, outputs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[tuple[str, dict[str, str], Path]] = []
    monkeypatch.setattr(deploy, "set_app_images", lambda *a: written.append(a))  # dry writer
    aws.replay = _replay("image_succeeded.json")
    result = _run("image", "--stack", "staging", "--outputs", str(outputs),
                  "--poll-seconds", "0", "--work-dir", str(checkout))
    assert result.exit_code == 0, result.output
    phases = [line.split()[1] for line in result.output.splitlines() if line.startswith("  ")]
    assert phases == ["PROVISIONING", "BUILD", "COMPLETED"], "one line per phase change"
    assert f"controlplane: sha256:{'a1' * 32}" in result.output
    assert written == [("staging-app", {"controlplane": "sha256:" + "a1" * 32,
                                        "gameday": "sha256:" + "b2" * 32}, checkout)]
    assert aws.sent("StartBuild")[0]["projectName"] == IMAGE
    assert len(aws.sent("BatchGetBuilds")) == 4


def test_image_sets_the_serving_and_tracking_digests_it_built(
        aws: Recorder, checkout: Path, outputs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The buildspec exports every IMAGE_DIGEST_*; one left empty (its repository variable
    unset) was not built and is not written."""
    written: list[tuple[str, dict[str, str], Path]] = []
    monkeypatch.setattr(deploy, "set_app_images", lambda *a: written.append(a))  # dry writer
    replay = _replay("image_succeeded.json")
    replay[-1]["builds"][0]["exportedEnvironmentVariables"] += [
        {"name": "IMAGE_DIGEST_SERVING", "value": "sha256:" + "c3" * 32},
        {"name": "IMAGE_DIGEST_TRACKING", "value": ""}]
    aws.replay = replay
    result = _run("image", "--stack", "staging", "--outputs", str(outputs),
                  "--poll-seconds", "0", "--work-dir", str(checkout))
    assert result.exit_code == 0, result.output
    assert f"serving: sha256:{'c3' * 32}" in result.output and "tracking:" not in result.output
    assert written == [("staging-app", {"controlplane": "sha256:" + "a1" * 32,
                                        "gameday": "sha256:" + "b2" * 32,
                                        "serving": "sha256:" + "c3" * 32}, checkout)]


def test_failed_deploy_exits_1_naming_the_phase_and_the_log(
        aws: Recorder, checkout: Path, outputs: Path) -> None:
    aws.replay = _replay("deploy_failed.json")
    result = _run("deploy", "--stack", "staging", "--outputs", str(outputs), "--image-digest",
                  f"controlplane={CP}", "--poll-seconds", "0", "--work-dir", str(checkout))
    assert result.exit_code == 1
    assert "FAILED in BUILD: Error while executing command" in result.output
    assert f"log group {LOGS}, stream deploy/0b1f6d7e" in result.output
    assert "deployed" not in result.output


def test_ctrl_c_says_the_build_goes_on(aws: Recorder, checkout: Path, outputs: Path) -> None:
    aws.interrupt = True
    result = _run("deploy", "--stack", "staging", "--outputs", str(outputs), "--image-digest",
                  f"controlplane={CP}", "--poll-seconds", "0", "--work-dir", str(checkout))
    assert result.exit_code == 1
    build_id = boto3.client("codebuild", region_name=REGION).list_builds_for_project(
        projectName=DEPLOY)["ids"][0]
    assert f"aws codebuild stop-build --id {build_id}" in result.output


def test_set_config_without_the_pulumi_cli_says_what_to_run(
        aws: Recorder, checkout: Path, outputs: Path) -> None:
    """The Automation API needs the Pulumi CLI, which this machine does not have: the
    command fails after the push, printing the exact `pulumi config set` lines."""
    aws.replay = _replay("image_succeeded.json")
    result = _run("image", "--stack", "staging", "--outputs", str(outputs),
                  "--poll-seconds", "0", "--work-dir", str(checkout))
    assert result.exit_code == 1
    assert (f"pulumi config set --path 'mlplatform:images.controlplane' sha256:{'a1' * 32} "
            "-s staging-app") in result.output


# --- --local with a fake docker ---------------------------------------------------------------

FAKE_DOCKER = """#!/usr/bin/env python3
import json, os, sys
stdin = sys.stdin.read() if "--password-stdin" in sys.argv else ""
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps({"argv": sys.argv[1:], "stdin": stdin}) + "\\n")
if sys.argv[1] == "inspect":
    ref = sys.argv[-1]
    repo = ref.rsplit(":", 1)[0]
    print(repo + "@sha256:" + ("c" if repo.endswith("controlplane") else "d") * 64)
"""


def test_local_build_commands_and_digests(aws: Recorder, checkout: Path, outputs: Path,
                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(FAKE_DOCKER)
    (bindir / "docker").chmod(0o755)
    log = tmp_path / "docker.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(log))
    result = _run("image", "--stack", "staging", "--outputs", str(outputs), "--local",
                  "--no-set-config", "--work-dir", str(checkout))
    assert result.exit_code == 0, result.output
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    login, *rest = calls
    assert login["argv"] == ["login", "--username", "AWS", "--password-stdin", REGISTRY]
    assert login["stdin"] and login["stdin"] not in json.dumps([c["argv"] for c in calls])
    commit = _git(checkout, "rev-parse", "--short=12", "HEAD")
    tag = rest[0]["argv"][4].rsplit(":", 1)[1]
    assert tag.startswith(f"{commit}-local-")
    assert [c["argv"] for c in rest] == [
        ["build", "--target", "controlplane", "-t", f"{REPOS['controlplane']}:{tag}", str(checkout)],
        ["push", f"{REPOS['controlplane']}:{tag}"],
        ["inspect", "--format", "{{index .RepoDigests 0}}", f"{REPOS['controlplane']}:{tag}"],
        ["build", "--target", "gameday", "-t", f"{REPOS['gameday']}:{tag}", str(checkout)],
        ["push", f"{REPOS['gameday']}:{tag}"],
        ["inspect", "--format", "{{index .RepoDigests 0}}", f"{REPOS['gameday']}:{tag}"],
    ]
    assert f"controlplane: sha256:{'c' * 64}" in result.output
    assert f"gameday: sha256:{'d' * 64}" in result.output
    assert aws.sent("StartBuild") == [], "--local never starts CodeBuild"


def test_local_build_needs_no_runner(aws: Recorder, checkout: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # dev: public endpoint, no deploy runner; the registry (and its region) is all --local needs
    outputs = tmp_path / "dev-outputs.json"
    outputs.write_text(json.dumps({"clusterName": "mlplatform-dev", "repositories": REPOS}))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(FAKE_DOCKER)
    (bindir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(tmp_path / "docker.log"))
    result = _run("image", "--stack", "dev", "--outputs", str(outputs), "--local",
                  "--no-set-config", "--work-dir", str(checkout))
    assert result.exit_code == 0, result.output
    assert f"controlplane: sha256:{'c' * 64}" in result.output
    # without --local the missing runner is named
    result = _run("image", "--stack", "dev", "--outputs", str(outputs), "--no-set-config",
                  "--work-dir", str(checkout))
    assert result.exit_code == 1 and "no 'deployRunner' output" in result.output


def test_repo_digest_parsing() -> None:
    repo = REPOS["controlplane"]
    assert deploy.repo_digest(f"{repo}@sha256:{'e' * 64}\n", repo) == f"sha256:{'e' * 64}"
    with pytest.raises(deploy.DeployError, match="expected"):
        deploy.repo_digest(f"{REPOS['gameday']}@sha256:{'e' * 64}", repo)  # another repository
    with pytest.raises(deploy.DeployError, match="expected"):
        deploy.repo_digest(f"{repo}@sha256:abc", repo)
    with pytest.raises(deploy.DeployError, match="expected"):
        deploy.repo_digest("", repo)  # never pushed: RepoDigests is empty


def test_outputs_without_a_runner_are_refused(tmp_path: Path, checkout: Path) -> None:
    path = tmp_path / "dev.json"
    path.write_text(json.dumps({"clusterName": "mlplatform-dev"}))
    result = _run("deploy", "--stack", "dev", "--outputs", str(path), "--work-dir", str(checkout))
    assert result.exit_code == 1
    assert f"{path}: no 'deployRunner' output" in result.output


def test_bad_image_digest_option_is_refused(checkout: Path, outputs: Path) -> None:
    result = _run("deploy", "--stack", "staging", "--outputs", str(outputs), "--image-digest",
                  "controlplane=latest", "--work-dir", str(checkout))
    assert result.exit_code == 1
    assert "--image-digest: controlplane digest 'latest' is not sha256:<64 hex>" in result.output


# The same fake in sh: 13 calls of a Python one cost seconds on a busy machine.
FAKE_DOCKER_SH = """#!/bin/sh
printf '%s\\n' "$*" >> "$FAKE_DOCKER_LOG"
if [ "$1" = login ]; then cat >/dev/null; fi
if [ "$1" = inspect ]; then for ref; do :; done; printf '%s@sha256:%064d\\n' "${ref%:*}" 0; fi
"""


def _fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake docker on PATH; returns its log, one line of arguments per call."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(FAKE_DOCKER_SH)
    (bindir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(tmp_path / "docker.log"))
    return tmp_path / "docker.log"


ALL_REPOS = {**REPOS, "serving": f"{REGISTRY}/mlplatform-staging/serving",
             "tracking": f"{REGISTRY}/mlplatform-staging/tracking"}


@pytest.mark.parametrize(("config", "built"), [
    (None, ["controlplane", "gameday", "serving", "tracking"]),  # Pulumi.staging.yaml as it is
    ("mlplatform:tracking", ["controlplane", "gameday", "serving"]),  # without tracking
])
def test_local_build_builds_serving_and_tracking_where_the_stack_runs_them(
        aws: Recorder, checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        config: str | None, built: list[str]) -> None:
    """--local reads which images the stack runs from its Pulumi.<stack>.yaml (the CodeBuild
    path gets the same answer as the image project's repository variables)."""
    if config is not None:
        stack_file = checkout / "Pulumi.staging.yaml"
        doc = yaml.safe_load(stack_file.read_text())
        del doc["config"][config]
        stack_file.write_text(yaml.safe_dump(doc))
        _git(checkout, "commit", "-qam", f"no {config}")
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"repositories": ALL_REPOS}))
    log = _fake_docker(tmp_path, monkeypatch)
    result = _run("image", "--stack", "staging", "--outputs", str(outputs), "--local",
                  "--no-set-config", "--work-dir", str(checkout))
    assert result.exit_code == 0, result.output
    builds = [line.split() for line in log.read_text().splitlines() if line.startswith("build ")]
    assert [argv[2] for argv in builds] == built
    assert [argv[4].rsplit(":", 1)[0] for argv in builds] == [ALL_REPOS[t] for t in built]
    assert [line.split(":")[0] for line in result.output.splitlines()
            if line.split(":")[0] in ALL_REPOS] == built


def test_local_build_names_the_stack_file_it_cannot_use(
        aws: Recorder, checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack_file = checkout / "Pulumi.staging.yaml"
    doc = yaml.safe_load(stack_file.read_text())
    doc["config"]["mlplatform:serving"]["port"] = 80
    stack_file.write_text(yaml.safe_dump(doc))
    _git(checkout, "commit", "-qam", "bad port")
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"repositories": ALL_REPOS}))
    log = _fake_docker(tmp_path, monkeypatch)
    result = _run("image", "--stack", "staging", "--outputs", str(outputs), "--local",
                  "--no-set-config", "--work-dir", str(checkout))
    assert result.exit_code == 1
    assert "Pulumi.staging.yaml" in result.output and "serving.port" in result.output, result.output
    assert not log.exists(), "nothing built before the config is read"
    (checkout / "Pulumi.staging.yaml").unlink()
    _git(checkout, "commit", "-qam", "no stack file")
    result = _run("image", "--stack", "staging", "--outputs", str(outputs), "--local",
                  "--no-set-config", "--work-dir", str(checkout))
    assert result.exit_code == 1 and "cannot read the platform stack's config" in result.output
