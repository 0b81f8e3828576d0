"""One customer-managed KMS key per region for platform data (S3, ECR, RDS, logs, SNS)."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from provisioning.components.common import TYPE_PREFIX, DataClass, Naming, child, policy_output


class DataKey(pulumi.ComponentResource):
    arn: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        naming: Naming,
        region: str,
        account_id: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:DataKey", name, None, opts)
        root = pulumi.Output.concat("arn:aws:iam::", account_id, ":root")
        key = aws.kms.Key(
            f"{name}-key",
            description=f"{naming.prefix} platform data ({region})",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            # Key policy (a resource policy): the account root keeps administration so the
            # key can never be orphaned; services that encrypt on our behalf are named.
            policy=policy_output([
                {"Sid": "AccountAdministration", "Effect": "Allow",
                 "Principal": {"AWS": root}, "Action": "kms:*", "Resource": "*"},
                {"Sid": "CloudWatchLogs", "Effect": "Allow",
                 "Principal": {"Service": f"logs.{region}.amazonaws.com"},
                 "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*",
                            "kms:DescribeKey"],
                 "Resource": "*"},
                {"Sid": "CloudWatchAlarmsToSns", "Effect": "Allow",
                 "Principal": {"Service": "cloudwatch.amazonaws.com"},
                 "Action": ["kms:Decrypt", "kms:GenerateDataKey*"], "Resource": "*"},
            ]),
            tags=naming.tags(f"{name}-key", DataClass.ENCRYPTION_KEYS),
            opts=child(self),
        )
        aws.kms.Alias(f"{name}-alias", name=f"alias/{name}", target_key_id=key.key_id, opts=child(self))
        self.arn = key.arn
        self.register_outputs({"arn": self.arn})
