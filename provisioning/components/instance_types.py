"""Capacity of the EC2 instance types the stacks use, for Karpenter NodePool ``limits``.

Karpenter limits a NodePool by the resources it may provision, not by a node count; the
stacks keep ``maxSize`` (nodes), so the limit is ``maxSize x`` the largest listed type.
Values are from the EC2 instance type pages (vCPUs, GiB memory, NVIDIA GPUs). A type
missing here is refused, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioning.config import ConfigError, GpuNodePoolConfig, NodePoolConfig


@dataclass(frozen=True)
class Capacity:
    vcpus: int
    memory_gib: int
    gpus: int = 0


INSTANCE_TYPES: dict[str, Capacity] = {
    "m6i.xlarge": Capacity(4, 16),
    "m7i.large": Capacity(2, 8),
    "m7i.xlarge": Capacity(4, 16),
    "m7i.2xlarge": Capacity(8, 32),
    "m7i.4xlarge": Capacity(16, 64),
    "g6.xlarge": Capacity(4, 16, gpus=1),     # 1 x NVIDIA L4
    "g6.2xlarge": Capacity(8, 32, gpus=1),    # 1 x NVIDIA L4
    "p5.48xlarge": Capacity(192, 2048, gpus=8),  # 8 x NVIDIA H100
}


def capacity(pool: str, instance_type: str) -> Capacity:
    try:
        return INSTANCE_TYPES[instance_type]
    except KeyError:
        raise ConfigError(
            f"mlplatform:nodePools.{pool}.instanceTypes: {instance_type!r} has no entry in "
            "provisioning/components/instance_types.py INSTANCE_TYPES (needed to derive the Karpenter "
            f"NodePool limits); known: {', '.join(sorted(INSTANCE_TYPES))}"
        ) from None


def pool_limits(pool: str, cfg: NodePoolConfig) -> dict[str, str]:
    """Karpenter ``spec.limits``: ``maxSize`` nodes of the largest configured type."""
    caps = [capacity(pool, t) for t in cfg.instance_types]
    if isinstance(cfg, GpuNodePoolConfig):
        wrong = [t for t, c in zip(cfg.instance_types, caps) if c.gpus != cfg.accelerators_per_node]
        if wrong:
            raise ConfigError(
                f"mlplatform:nodePools.{pool}.acceleratorsPerNode is {cfg.accelerators_per_node} "
                f"but {wrong} carry a different number of GPUs (INSTANCE_TYPES)")
    limits = {
        "cpu": str(cfg.max_size * max(c.vcpus for c in caps)),
        "memory": f"{cfg.max_size * max(c.memory_gib for c in caps)}Gi",
    }
    gpus = max(c.gpus for c in caps)
    if gpus:
        limits["nvidia.com/gpu"] = str(cfg.max_size * gpus)
    return limits
