"""Artifact/checkpoint bucket: private, versioned, KMS-encrypted, owner-enforced, with
lifecycle rules, TLS-only access, request metrics and optional cross-region replication."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from provisioning.components.common import TYPE_PREFIX, DataClass, Naming, child, policy_output
from provisioning.components.encryption import DataKey
from provisioning.config import ArtifactsConfig
from provisioning.objectives import ArtifactSettings


class _SecureBucket(pulumi.ComponentResource):
    bucket: aws.s3.Bucket
    versioning: aws.s3.BucketVersioning

    def __init__(
        self,
        name: str,
        naming: Naming,
        kms_key_arn: pulumi.Input[str],
        cfg: ArtifactsConfig,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:SecureBucket", name, None, opts)
        self.bucket = aws.s3.Bucket(
            name, force_destroy=False, tags=naming.tags(name, DataClass.ARTIFACTS),
            opts=child(self),
        )
        aws.s3.BucketPublicAccessBlock(
            name, bucket=self.bucket.id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=child(self),
        )
        aws.s3.BucketOwnershipControls(
            name, bucket=self.bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=child(self),
        )
        self.versioning = aws.s3.BucketVersioning(
            name, bucket=self.bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
            opts=child(self),
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            name, bucket=self.bucket.id,
            rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                    sse_algorithm="aws:kms", kms_master_key_id=kms_key_arn,
                ),
                bucket_key_enabled=True,  # fewer KMS calls for many small checkpoint files
            )],
            opts=child(self),
        )
        aws.s3.BucketLifecycleConfiguration(
            name, bucket=self.bucket.id,
            rules=[
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="abort-incomplete-uploads", status="Enabled",
                    filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                    abort_incomplete_multipart_upload=aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                        days_after_initiation=cfg.abort_incomplete_upload_days),
                ),
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="expire-noncurrent-versions", status="Enabled",
                    filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                    noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                        noncurrent_days=cfg.noncurrent_version_expiry_days),
                ),
            ],
            opts=child(self, depends_on=[self.versioning]),
        )
        aws.s3.BucketPolicy(
            name, bucket=self.bucket.id,
            policy=policy_output([{
                "Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*",
                "Action": "s3:*",
                "Resource": [self.bucket.arn, pulumi.Output.concat(self.bucket.arn, "/*")],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            }]),
            opts=child(self),
        )
        self.register_outputs({"bucket": self.bucket.id})


class ArtifactStore(pulumi.ComponentResource):
    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]
    replica_bucket_name: pulumi.Output[str] | None

    def __init__(
        self,
        name: str,
        cfg: ArtifactsConfig,
        settings: ArtifactSettings,
        naming: Naming,
        kms_key_arn: pulumi.Input[str],
        account_id: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:ArtifactStore", name, None, opts)
        primary = _SecureBucket(f"{name}-bucket", naming, kms_key_arn, cfg, opts=child(self))
        aws.s3.BucketMetric(  # request metrics feed the 5xx alarm (observability.py)
            f"{name}-requests", bucket=primary.bucket.id, name="EntireBucket", opts=child(self)
        )
        self.bucket_name, self.bucket_arn = primary.bucket.id, primary.bucket.arn
        self.replica_bucket_name = None
        if settings.replicate and settings.replica_region:
            self._replicate(name, cfg, settings, naming, primary, kms_key_arn, account_id)
        self.register_outputs({"bucket": self.bucket_name, "replica": self.replica_bucket_name})

    def _replicate(
        self,
        name: str,
        cfg: ArtifactsConfig,
        settings: ArtifactSettings,
        naming: Naming,
        primary: _SecureBucket,
        kms_key_arn: pulumi.Input[str],
        account_id: pulumi.Input[str],
    ) -> None:
        region = settings.replica_region
        assert region is not None
        provider = aws.Provider(f"{name}-{region}", region=region,
                                default_tags=aws.ProviderDefaultTagsArgs(tags=naming.tags()),
                                opts=child(self))
        replica_key = DataKey(f"{name}-replica", naming, region, account_id,
                              opts=child(self, providers={"aws": provider}))
        replica = _SecureBucket(f"{name}-replica", naming, replica_key.arn, cfg,
                                opts=child(self, providers={"aws": provider}))
        role = aws.iam.Role(
            f"{name}-replication",
            assume_role_policy=policy_output([{
                "Effect": "Allow", "Principal": {"Service": "s3.amazonaws.com"},
                "Action": "sts:AssumeRole"}]),
            tags=naming.tags(f"{name}-replication"),
            opts=child(self),
        )
        aws.iam.RolePolicy(
            f"{name}-replication", role=role.id,
            policy=policy_output([
                {"Effect": "Allow", "Action": ["s3:GetReplicationConfiguration", "s3:ListBucket"],
                 "Resource": [primary.bucket.arn]},
                {"Effect": "Allow",
                 "Action": ["s3:GetObjectVersionForReplication", "s3:GetObjectVersionAcl",
                            "s3:GetObjectVersionTagging"],
                 "Resource": [pulumi.Output.concat(primary.bucket.arn, "/*")]},
                {"Effect": "Allow",
                 "Action": ["s3:ReplicateObject", "s3:ReplicateDelete", "s3:ReplicateTags"],
                 "Resource": [pulumi.Output.concat(replica.bucket.arn, "/*")]},
                {"Effect": "Allow", "Action": ["kms:Decrypt"], "Resource": [kms_key_arn]},
                {"Effect": "Allow", "Action": ["kms:Encrypt", "kms:GenerateDataKey"],
                 "Resource": [replica_key.arn]},
            ]),
            opts=child(self),
        )
        rtc = settings.replication_time_control
        aws.s3.BucketReplicationConfig(
            f"{name}-replication",
            bucket=primary.bucket.id,
            role=role.arn,
            rules=[aws.s3.BucketReplicationConfigRuleArgs(
                id="all-objects", status="Enabled", priority=1,
                filter=aws.s3.BucketReplicationConfigRuleFilterArgs(prefix=""),
                delete_marker_replication=aws.s3.BucketReplicationConfigRuleDeleteMarkerReplicationArgs(
                    status="Enabled"),
                source_selection_criteria=aws.s3.BucketReplicationConfigRuleSourceSelectionCriteriaArgs(
                    sse_kms_encrypted_objects=aws.s3.BucketReplicationConfigRuleSourceSelectionCriteriaSseKmsEncryptedObjectsArgs(
                        status="Enabled")),
                destination=aws.s3.BucketReplicationConfigRuleDestinationArgs(
                    bucket=replica.bucket.arn,
                    storage_class="STANDARD",
                    encryption_configuration=aws.s3.BucketReplicationConfigRuleDestinationEncryptionConfigurationArgs(
                        replica_kms_key_id=replica_key.arn),
                    replication_time=aws.s3.BucketReplicationConfigRuleDestinationReplicationTimeArgs(
                        status="Enabled", time=aws.s3.BucketReplicationConfigRuleDestinationReplicationTimeTimeArgs(minutes=15),
                    ) if rtc else None,
                    # Replication metrics on with or without RTC: the replication alarm
                    # (observability.py) reads OperationsFailedReplication, which S3 publishes
                    # only for rules with metrics on. The event threshold belongs to RTC.
                    metrics=aws.s3.BucketReplicationConfigRuleDestinationMetricsArgs(
                        status="Enabled",
                        event_threshold=aws.s3.BucketReplicationConfigRuleDestinationMetricsEventThresholdArgs(
                            minutes=15) if rtc else None,
                    ),
                ),
            )],
            # Replication needs versioning on both sides first.
            opts=child(self, depends_on=[primary.versioning, replica.versioning]),
        )
        self.replica_bucket_name = replica.bucket.id
