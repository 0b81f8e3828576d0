"""The runtime interface: start an attempt's workload, stream its events, learn how it ended.

A runtime turns a ``LaunchSpec`` into a running workload and a ``RunHandle``. The agent
owns the lease and the reporting; a runtime only executes and observes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from controlplane.workload.events import WorkloadEvent

# kind -> {params key -> workload CLI flag}; anything else is an invalid submission.
_TRAIN_FLAGS = {
    "steps": "--steps",
    "checkpoint_every": "--checkpoint-every",
    "seed": "--seed",
    "batch_size": "--batch-size",
    "learning_rate": "--learning-rate",
    "step_delay": "--step-delay",
    "checkpoint_commit_delay": "--checkpoint-commit-delay",
    "checkpoint_upload_every": "--checkpoint-upload-every",
    "checkpoint_sync_delay": "--checkpoint-sync-delay",
    "tracking": "--tracking",  # 1: log to $MLFLOW_TRACKING_URI (controlplane/workload/tracking.py)
}
PARAM_FLAGS: dict[str, dict[str, str]] = {
    "train": _TRAIN_FLAGS,
    "sleep": {"seconds": "--seconds"},  # load-test filler: progress + artifacts, no compute
    "fail": {"exit_code": "--exit-code", "seconds": "--seconds"},  # fault injection
    # pipeline steps (controlplane/workload/steps.py); train candidates use "train"
    "prepare": {"seconds": "--seconds"},
    "evaluate": {"seconds": "--seconds", "min_candidates": "--min-candidates"},
}
WORKLOAD_KINDS = frozenset(PARAM_FLAGS)


class InvalidWorkload(ValueError):
    """The workload section cannot be run by this agent (deterministic start failure)."""


@dataclass(frozen=True)
class LaunchSpec:
    operation_id: str
    attempt_id: str
    attempt_number: int
    project: str
    kind: str
    image: str  # pinned by digest: registry/name@sha256:...
    params: Mapping[str, Any]
    cpu: int = 1
    accelerator_type: str | None = None
    accelerator_count: int = 0
    s3_endpoint: str | None = None
    bucket: str = "ml-artifacts"
    timeout_seconds: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    workload_class: str | None = None  # controlplane/workload_classes.py
    interruptible: bool = False  # may run on spot capacity (checkpointable classes only)
    # a pipeline step's inputs (JSON): the upstream manifests it must start from, explicitly;
    # or an operation's declared datasets (controlplane/pipelines/manifest.py given_inputs)
    pipeline_inputs: str | None = None


def workload_args(spec: LaunchSpec) -> list[str]:
    """The sample workload's arguments (after ``python -m controlplane.workload``)."""
    if spec.kind not in WORKLOAD_KINDS:
        raise InvalidWorkload(f"workload.kind {spec.kind!r} is not one of {sorted(WORKLOAD_KINDS)}")
    flags = PARAM_FLAGS[spec.kind]
    unknown = set(spec.params) - set(flags)
    if unknown:
        raise InvalidWorkload(f"workload.params has unknown keys {sorted(unknown)} for kind "
                              f"{spec.kind!r}; allowed: {sorted(flags)}")
    args = ["--kind", spec.kind, "--operation-id", spec.operation_id,
            "--attempt", str(spec.attempt_number), "--bucket", spec.bucket]
    if spec.s3_endpoint:
        args += ["--s3-endpoint", spec.s3_endpoint]
    for key, value in sorted(spec.params.items()):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidWorkload(f"workload.params.{key} must be a number, got {value!r}")
        args += [flags[key], str(value)]
    if spec.pipeline_inputs is not None:
        args += ["--pipeline-inputs", spec.pipeline_inputs]
    return args


class Outcome(Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class RunResult:
    outcome: Outcome
    reason: str
    transient: bool = True  # for failures: may a retry help?
    exit_code: int | None = None


class RunHandle(Protocol):
    def drain_events(self) -> list[WorkloadEvent]:
        """Events produced since the last call (oldest first)."""

    def result(self) -> RunResult | None:
        """How the workload ended, or None while it still runs (or waits to be scheduled)."""

    def pending_reason(self) -> str | None:
        """Why the workload is not running yet (e.g. unschedulable), or None."""

    def wait(self, timeout: float) -> None:
        """Return once the workload has ended, or after ``timeout`` seconds at the latest."""

    def stop(self, grace_seconds: float = 2.0) -> None:
        """Stop the workload (terminate, then kill after the grace period); idempotent."""


class Runtime(Protocol):
    name: str

    def start(self, spec: LaunchSpec) -> RunHandle:
        """Start the workload; raises InvalidWorkload for a spec it cannot run."""
