"""IAM roles for Kubernetes service accounts (IRSA), each scoped to named resources."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_aws as aws

from infra.components.common import TYPE_PREFIX, Naming, child, policy_output


class WorkloadIdentity(pulumi.ComponentResource):
    """One IAM role assumable only by ``system:serviceaccount:<namespace>:<name>``."""

    role_arn: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        naming: Naming,
        namespace: str,
        service_account: str,
        oidc_provider_arn: pulumi.Input[str],
        oidc_provider_url: pulumi.Input[str],
        statements: list[dict[str, Any]],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:WorkloadIdentity", name, None, opts)
        issuer = pulumi.Output.from_input(oidc_provider_url).apply(
            lambda url: url.removeprefix("https://")
        )
        trust = pulumi.Output.all(oidc_provider_arn, issuer).apply(lambda a: [{
            "Effect": "Allow",
            "Principal": {"Federated": a[0]},
            "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {"StringEquals": {
                f"{a[1]}:sub": f"system:serviceaccount:{namespace}:{service_account}",
                f"{a[1]}:aud": "sts.amazonaws.com",
            }},
        }])
        role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=policy_output(trust),
            tags=naming.tags(f"{name}-role", **{"platform.gameday/service-account": f"{namespace}/{service_account}"}),
            opts=child(self),
        )
        if statements:
            aws.iam.RolePolicy(f"{name}-policy", role=role.id, policy=policy_output(statements), opts=child(self))
        self.role_arn = role.arn
        self.register_outputs({"role_arn": self.role_arn})
