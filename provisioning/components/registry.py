"""ECR repositories: immutable tags, scan on push, KMS encryption, lifecycle policy."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from provisioning.components.common import TYPE_PREFIX, DataClass, Naming, child
from provisioning.config import RegistryConfig


def lifecycle_policy(cfg: RegistryConfig) -> str:
    return json.dumps({"rules": [
        {"rulePriority": 1, "description": "expire untagged images",
         "selection": {"tagStatus": "untagged", "countType": "sinceImagePushed",
                       "countUnit": "days", "countNumber": cfg.untagged_expiry_days},
         "action": {"type": "expire"}},
        {"rulePriority": 2, "description": "keep the newest tagged images",
         "selection": {"tagStatus": "tagged", "tagPatternList": ["*"],
                       "countType": "imageCountMoreThan", "countNumber": cfg.keep_tagged_images},
         "action": {"type": "expire"}},
    ]}, sort_keys=True)


class Registry(pulumi.ComponentResource):
    repositories: dict[str, aws.ecr.Repository]

    def __init__(
        self,
        name: str,
        cfg: RegistryConfig,
        naming: Naming,
        kms_key_arn: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:Registry", name, None, opts)
        self.repositories = {}
        for repo in cfg.repositories:
            slug = repo.replace("/", "-")
            r = aws.ecr.Repository(
                f"{name}-{slug}",
                name=f"{naming.prefix}/{repo}",
                image_tag_mutability="IMMUTABLE",
                image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(
                    scan_on_push=True
                ),
                encryption_configurations=[aws.ecr.RepositoryEncryptionConfigurationArgs(
                    encryption_type="KMS", kms_key=kms_key_arn
                )],
                force_delete=False,
                tags=naming.tags(f"{naming.prefix}/{repo}", DataClass.IMAGES),
                opts=child(self),
            )
            aws.ecr.LifecyclePolicy(
                f"{name}-{slug}", repository=r.name, policy=lifecycle_policy(cfg), opts=child(self)
            )
            self.repositories[repo] = r
        self.register_outputs({k: v.repository_url for k, v in self.repositories.items()})
