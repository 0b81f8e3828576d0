"""Workload classes: one template per kind of ML work, shared by the API and the Pulumi program.

A submission that names ``workload_class`` gets the class's operation defaults (queue,
priority, resources, retries, timeout, placement) and may set only the fields the class lists
as overridable; anything else is refused with the field's path, so a team cannot quietly
give a notebook a GPU pool's priority or a week-long timeout. The same table gives the
Kubernetes runtime and the Pulumi program (``provisioning/components/workload_classes.py``) each
class's service account, logging, security context and capacity: interruptible (spot)
capacity only for classes marked checkpointable, since an interruption without a checkpoint
loses all progress.

Pure data and functions: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Fields every submission may set whatever its class: they say *what* runs (and on which
# data), not how.
ALWAYS_ALLOWED = frozenset({"name", "workload_class", "workload.kind", "workload.image",
                            "workload.params", "labels", "datasets"})


class ClassRefused(ValueError):
    """A submission the class does not allow; the message names the field."""


@dataclass(frozen=True)
class StorageConnection:
    """Where the class's work reads or writes, relative to the artifact bucket."""

    prefix: str
    access: str  # read | read-write


@dataclass(frozen=True)
class Logging:
    level: str = "INFO"
    retention_days: int = 30


@dataclass(frozen=True)
class SecurityContext:
    run_as_non_root: bool = True
    read_only_root_filesystem: bool = True
    allow_privilege_escalation: bool = False

    def container(self) -> dict[str, Any]:
        return {"allowPrivilegeEscalation": self.allow_privilege_escalation,
                "readOnlyRootFilesystem": self.read_only_root_filesystem,
                "capabilities": {"drop": ["ALL"]}}


@dataclass(frozen=True)
class WorkloadClass:
    name: str
    description: str
    defaults: Mapping[str, Any]  # dotted OperationSpec paths -> value
    overridable: frozenset[str]  # dotted OperationSpec paths a team may set
    checkpointable: bool
    pool: str  # the node pool its work runs on (cpu | gpu)
    storage: tuple[StorageConnection, ...]
    logging: Logging = field(default_factory=Logging)
    security: SecurityContext = field(default_factory=SecurityContext)

    @property
    def service_account(self) -> str:
        return f"wc-{self.name}"

    @property
    def capacity_types(self) -> tuple[str, ...]:
        """Karpenter capacity types its pods may land on."""
        return ("spot", "on-demand") if self.checkpointable else ("on-demand",)


_PLACEMENT = frozenset({"placement.regions", "placement.dataset"})

CLASSES: dict[str, WorkloadClass] = {c.name: c for c in (
    WorkloadClass(
        name="interactive-notebook",
        description="A person's exploratory session: small, never preempted, short-lived.",
        defaults={"queue": "default", "priority": 20, "resources.cpu": 2, "max_retries": 0,
                  "timeout_seconds": 8 * 3600},
        overridable=frozenset({"resources.cpu", "timeout_seconds"}),
        checkpointable=False, pool="cpu",
        storage=(StorageConnection("datasets/", "read"), StorageConnection("scratch/", "read-write")),
        # notebooks install packages at run time: a writable root filesystem
        security=SecurityContext(read_only_root_filesystem=False),
    ),
    WorkloadClass(
        name="batch-preprocessing",
        description="Dataset preparation: CPU only, idempotent per input, retried freely.",
        defaults={"queue": "default", "priority": 0, "resources.cpu": 4, "max_retries": 5,
                  "timeout_seconds": 6 * 3600},
        overridable=frozenset({"resources.cpu", "priority", "max_retries",
                               "placement.interruptible", *_PLACEMENT}),
        checkpointable=True, pool="cpu",
        storage=(StorageConnection("datasets/", "read-write"),),
    ),
    WorkloadClass(
        name="distributed-training",
        description="Long GPU training that writes checkpoints and resumes from them.",
        defaults={"queue": "gpu", "priority": 10, "resources.cpu": 4,
                  "resources.accelerator": {"type": "sim-a100", "count": 1}, "max_retries": 3,
                  "timeout_seconds": 3 * 24 * 3600},
        overridable=frozenset({"resources.cpu", "resources.accelerator", "max_retries",
                               "timeout_seconds", "placement.interruptible", *_PLACEMENT}),
        checkpointable=True, pool="gpu",
        storage=(StorageConnection("datasets/", "read"), StorageConnection("checkpoints/", "read-write"),
                 StorageConnection("models/", "read-write")),
        logging=Logging(retention_days=90),
    ),
    WorkloadClass(
        name="scheduled-evaluation",
        description="A recurring evaluation of registered models: reads only, must finish.",
        defaults={"queue": "default", "priority": 5, "resources.cpu": 2, "max_retries": 2,
                  "timeout_seconds": 2 * 3600},
        overridable=frozenset({"resources.cpu", "resources.accelerator", *_PLACEMENT}),
        checkpointable=False, pool="cpu",
        storage=(StorageConnection("models/", "read"), StorageConnection("evaluations/", "read-write")),
    ),
    WorkloadClass(
        name="online-inference",
        description="Serving replicas: latency-bound, never on interruptible capacity.",
        defaults={"queue": "default", "priority": 50, "resources.cpu": 2, "max_retries": 10,
                  "timeout_seconds": 7 * 24 * 3600},
        overridable=frozenset({"resources.cpu", "resources.accelerator", "placement.regions"}),
        checkpointable=False, pool="cpu",
        storage=(StorageConnection("models/", "read"),),
        logging=Logging(level="WARNING", retention_days=14),
    ),
)}


def lookup(name: str) -> WorkloadClass:
    try:
        return CLASSES[name]
    except KeyError:
        raise ClassRefused(f"workload_class {name!r} is not one of {sorted(CLASSES)}") from None


def check_overrides(wc: WorkloadClass, explicit: set[str]) -> None:
    """Refuse the first explicitly set field the class does not let teams override."""
    allowed = ALWAYS_ALLOWED | wc.overridable
    for path in sorted(explicit):
        if path not in allowed and not any(path.startswith(a + ".") for a in allowed):
            raise ClassRefused(
                f"{path}: not overridable for workload_class {wc.name!r} "
                f"(overridable: {', '.join(sorted(wc.overridable))})")


def check_capacity(wc: WorkloadClass | None, interruptible: bool) -> None:
    if interruptible and (wc is None or not wc.checkpointable):
        what = f"workload_class {wc.name!r} is not checkpointable" if wc else (
            "no workload_class vouches that the work checkpoints")
        raise ClassRefused(f"placement.interruptible: {what}; interruptible capacity would "
                           "lose all progress at the first interruption")


def apply_defaults(doc: dict[str, Any], wc: WorkloadClass, explicit: set[str]) -> dict[str, Any]:
    """The operation document with the class's defaults for every field not set explicitly."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in doc.items()}
    for path, value in wc.defaults.items():
        if path in explicit:
            continue
        *parents, leaf = path.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = dict(value) if isinstance(value, dict) else value
    return out
