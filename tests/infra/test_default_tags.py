"""Default tags: what other components create inside (pulumi-eks's OIDC provider, launch
templates) is tagged by the AWS provider, and the policy counts those tags."""

from __future__ import annotations

import json

import pytest
from pulumi_policy import PolicyProviderResource, ResourceValidationArgs

from provisioning.config import ConfigError
from provisioning.policies import required_tags
from tests.infra.harness import Run, run_program, stack_config
from tests.infra.test_policies_and_schema import OPTS

TAGS = stack_config("dev")["aws:defaultTags"]["tags"]


def test_explicit_aws_providers_carry_the_default_tags(
        runs: dict[str, Run]) -> None:
    # explicit providers (prod's replica region); the default one is configured by the stack
    providers = runs["prod"].of_type("pulumi:providers:aws")
    assert providers
    for p in providers:
        tags = p.props["defaultTags"]
        tags = json.loads(tags) if isinstance(tags, str) else tags
        assert tags["tags"]["environment"] == "prod" and tags["tags"]["owner"]


def test_missing_or_disagreeing_default_tags_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"aws:defaultTags.tags is not set"):
        run_program("dev", {"aws:defaultTags": None})
    wrong = {"tags": {**TAGS, "owner": "someone-else"}}
    with pytest.raises(ConfigError, match=r"aws:defaultTags.tags.owner is 'someone-else', "
                                          r"expected 'ml-platform'"):
        run_program("dev", {"aws:defaultTags": wrong})


def _violations(provider: PolicyProviderResource | None) -> list[str]:
    found: list[str] = []
    args = ResourceValidationArgs("aws:iam/openIdConnectProvider:OpenIdConnectProvider",
                                  {"url": "https://oidc"}, "urn:x", "eks-oidc", OPTS, provider)
    required_tags.validate(args, lambda msg, urn=None: found.append(msg))
    return found


def test_the_policy_counts_the_providers_default_tags() -> None:
    # a child pulumi-eks creates without a tags input: untagged unless its provider tags it
    assert _violations(None) and "missing required tags" in _violations(None)[0]
    for encoded in ({"tags": TAGS}, json.dumps({"tags": TAGS})):
        provider = PolicyProviderResource("pulumi:providers:aws", {"defaultTags": encoded},
                                          "urn:p", "default")
        assert _violations(provider) == []
    partial = PolicyProviderResource("pulumi:providers:aws",
                                     {"defaultTags": {"tags": {"owner": "x"}}}, "urn:p", "default")
    assert "missing required tags" in _violations(partial)[0]
