"""The two layers (docs/infra.md "Stacks in layers"): the platform stack only talks to AWS,
the application stack gets every AWS value from the platform's outputs (checked by running
it on exactly those outputs), images pinned by digest, and the cluster reached without the
`aws` CLI."""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from provisioning.config import ConfigError
from provisioning.layers import outputs as out
from provisioning.render import PLACEHOLDER_MODEL, merge, run_stack
from tests.infra.harness import (
    TEST_IMAGES,
    PlatformMocks,
    Run,
    app_stack,
    run_program,
    stack_config,
)

STACKS = ("dev", "staging", "prod")


def _app_run(stack: str, platform_outputs: dict[str, Any], app_patch: dict | None = None) -> Any:
    """The application layer alone, on the given platform outputs."""
    config = merge(merge(stack_config(app_stack(stack)), {"mlplatform:images": TEST_IMAGES,
                                                          "mlplatform:servedModel": PLACEHOLDER_MODEL}),
                   app_patch or {})
    return run_stack(app_stack(stack), config, PlatformMocks(platform_outputs))


@pytest.mark.parametrize("stack", STACKS)
def test_platform_layer_never_needs_the_cluster_endpoint(runs: dict[str, Run], stack: str) -> None:
    # With a private endpoint the platform is deployed from outside the VPC: nothing in it may
    # talk to the Kubernetes API.
    platform = runs[stack].layer(stack)
    k8s = [r.name for r in platform if r.type.startswith("kubernetes:")
           or r.type == "pulumi:providers:kubernetes"]
    assert platform and k8s == []
    app = runs[stack].layer(app_stack(stack))
    assert not [r.name for r in app if r.type.startswith("aws:")], "app layer creates no AWS resources"
    assert any(r.type == "kubernetes:apps/v1:Deployment" for r in app)


@pytest.mark.parametrize("stack", STACKS)
def test_platform_exports_everything_the_application_reads(runs: dict[str, Run], stack: str) -> None:
    exported = runs[stack].exports[stack]
    assert set(out.REQUIRED_BY_APPLICATION) <= set(exported)
    # Each reference names this environment's platform stack.
    ref = runs[stack].one("pulumi:pulumi:StackReference")
    assert ref.name == f"organization/mlplatform/{stack}"


@pytest.mark.parametrize("key", out.REQUIRED_BY_APPLICATION)
def test_application_refuses_platform_outputs_without_a_key(runs: dict[str, Run], key: str) -> None:
    outputs = {k: v for k, v in runs["dev"].exports["dev"].items() if k != key}
    with pytest.raises(Exception, match=f"has no '{key}'.*pulumi up. on the platform stack"):
        _app_run("dev", outputs)


def test_application_refuses_a_platform_stack_of_another_environment(runs: dict[str, Run]) -> None:
    outputs = {**runs["dev"].exports["dev"], out.ENVIRONMENT: "prod"}
    with pytest.raises(Exception, match="environment 'prod', but Pulumi.dev.yaml in this checkout says 'dev'"):
        _app_run("dev", outputs)


def test_a_missing_role_is_named(runs: dict[str, Run]) -> None:
    roles = {k: v for k, v in runs["dev"].exports["dev"][out.ROLE_ARNS].items() if k != "agent-gpu"}
    with pytest.raises(Exception, match="'roleArns' has no 'agent-gpu'"):
        _app_run("dev", {**runs["dev"].exports["dev"], out.ROLE_ARNS: roles})


@pytest.mark.parametrize("stack", STACKS)
def test_service_accounts_carry_the_platform_roles(runs: dict[str, Run], stack: str) -> None:
    run = runs[stack]
    roles = {r.props["arn"] for r in run.layer(stack) if r.type == "aws:iam/role:Role"}
    annotated = {sa.props["metadata"]["name"]: sa.props["metadata"].get("annotations", {})
                 .get("eks.amazonaws.com/role-arn")
                 for sa in run.layer(app_stack(stack)) if sa.type == "kubernetes:core/v1:ServiceAccount"}
    exported = run.exports[stack][out.ROLE_ARNS]
    assert set(exported) == set(out.role_names(_cfg(stack)))
    assert set(exported.values()) <= roles  # the ARNs of roles the platform declares
    for sa in ("api", "reconciler", "external-secrets-db", "agent-cpu", "agent-gpu"):
        assert annotated[sa] == exported[sa], sa


def _cfg(stack: str) -> Any:
    from provisioning.config import parse_stack_config

    raw = {k.split(":", 1)[1]: v for k, v in stack_config(stack).items() if k.startswith("mlplatform:")}
    return parse_stack_config(raw)


@pytest.mark.parametrize("stack", STACKS)
def test_images_are_the_platform_registry_at_the_recorded_digest(runs: dict[str, Run], stack: str) -> None:
    run = runs[stack]
    repo = run.exports[stack][out.REPOSITORIES]["controlplane"]
    images = {c["image"] for d in run.of_type("kubernetes:apps/v1:Deployment")
              if d.props["metadata"]["name"].startswith("controlplane-")
              for c in d.props["spec"]["template"]["spec"]["containers"]}
    assert images == {f"{repo}@{TEST_IMAGES['controlplane']}"}
    migrate = run.one("kubernetes:batch/v1:Job", "migrate")
    assert migrate.props["metadata"]["name"] == "controlplane-migrate-" + TEST_IMAGES["controlplane"][7:19]
    assert run.exports[app_stack(stack)]["controlPlaneImage"] == f"{repo}@{TEST_IMAGES['controlplane']}"


def test_application_without_a_recorded_digest_says_how_to_get_one() -> None:
    with pytest.raises(ConfigError, match=r"mlplatform:images.controlplane is not set in Pulumi.dev-app.yaml.*"
                                          r"gameday infra image --stack"):
        run_program("dev", app_patch={"mlplatform:images": {"controlplane": None}})


def test_a_tag_is_not_a_digest() -> None:
    with pytest.raises(ConfigError, match=r"mlplatform:images.controlplane"):
        run_program("dev", app_patch={"mlplatform:images": {"controlplane": "0.1.0"}})


def test_environment_settings_in_the_application_stack_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"mlplatform:controlPlane belong\(s\) in the platform stack's file"):
        run_program("dev", app_patch={"mlplatform:controlPlane": {"api": {"replicas": 3}}})


def test_application_keys_in_the_platform_stack_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"mlplatform:images belong\(s\) in an application stack"):
        run_program("dev", {"mlplatform:images": {"controlplane": TEST_IMAGES["controlplane"]}},
                    layers=("platform",))


def test_unknown_layer_is_refused() -> None:
    with pytest.raises(ConfigError, match="mlplatform:layer is 'apps'; allowed: platform, application"):
        run_program("dev", {"mlplatform:layer": "apps"}, layers=("platform",))


@pytest.mark.parametrize("stack", STACKS)
def test_kubeconfig_uses_the_package_not_the_aws_cli(runs: dict[str, Run], stack: str) -> None:
    kubeconfig = json.loads(runs[stack].exports[app_stack(stack)]["kubeconfig"])
    user = kubeconfig["users"][0]["user"]
    assert "token" not in user  # nothing that expires (or leaks) is stored
    assert user["exec"]["command"] == "gameday"
    assert user["exec"]["args"] == ["infra", "kube-token", "--cluster", f"mlplatform-{stack}",
                                    "--region", "eu-west-1"]
    cluster = kubeconfig["clusters"][0]["cluster"]
    assert cluster["server"] == f"https://mlplatform-{stack}.mock.eks.amazonaws.com"
    provider = runs[stack].one("pulumi:providers:kubernetes")
    assert json.loads(provider.props["kubeconfig"]) == kubeconfig


def test_eks_token_is_a_presigned_get_caller_identity_for_the_cluster() -> None:
    import boto3

    from environments.cloud.eks_token import TOKEN_PREFIX, eks_token, exec_credential

    session = boto3.session.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret",
                                    region_name="eu-west-1")
    token = eks_token("mlplatform-dev", "eu-west-1", session=session)
    assert token.startswith(TOKEN_PREFIX) and "=" not in token
    raw = token[len(TOKEN_PREFIX):]
    url = urlparse(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode())
    query = parse_qs(url.query)
    assert url.netloc == "sts.eu-west-1.amazonaws.com"
    assert query["Action"] == ["GetCallerIdentity"] and query["X-Amz-Expires"] == ["60"]
    assert "x-k8s-aws-id" in query["X-Amz-SignedHeaders"][0].split(";")
    assert query["X-Amz-Credential"][0].startswith("AKIDEXAMPLE/")
    cred = exec_credential(token)
    assert cred["kind"] == "ExecCredential" and cred["status"]["token"] == token


def test_eks_token_without_credentials_is_a_clear_error() -> None:
    from environments.cloud.eks_token import TokenError, eks_token

    class NoCredentials:
        def get_credentials(self) -> None:
            return None

    with pytest.raises(TokenError, match="no AWS credentials found"):
        eks_token("c", "eu-west-1", session=NoCredentials())
