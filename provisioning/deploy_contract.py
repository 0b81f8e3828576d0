"""What the provisioned deploy runner (provisioning/components/deploy_runner.py) and the operator's
`gameday infra image|deploy` (operations/deploy.py) agree on: the images built and where uploaded
sources go. Its own module so the Pulumi program never imports the operator's tools."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from provisioning.config import StackConfig

# Dockerfile targets, each pushed to the ECR repository of the same name (provisioning/buildspecs/image.yml)
IMAGE_TARGETS = ("controlplane", "gameday", "serving", "tracking")
SOURCE_PREFIX = "source/"  # key prefix of the uploaded source archives in the artifacts bucket


def built_targets(cfg: StackConfig) -> tuple[str, ...]:
    """The targets a stack builds: controlplane and gameday always (where it has their
    repositories); serving and tracking only where the stack runs them from its own registry
    (the section is set and names no image from elsewhere): a KServe or MLflow build no
    deployment runs is minutes of CodeBuild for nothing."""
    skipped = {name for name, section in (("serving", cfg.serving), ("tracking", cfg.tracking))
               if section is None or section.image is not None}
    return tuple(t for t in IMAGE_TARGETS if t not in skipped)
