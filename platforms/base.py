"""The adapter interface between the harness and a platform under test (docs/DESIGN.md section 7).

The SLO math never sees a platform: adapters translate the platform's own records into the
generic evidence files of docs/EVIDENCE.md. Experiments reach the platform only through these
methods, so adding a platform means writing one adapter, not changing the experiments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


class PlatformError(Exception):
    """The platform refused or could not answer (message says which call and why)."""


@dataclass(frozen=True)
class Workload:
    """The sample training job, in platform-neutral terms."""

    steps: int = 40
    checkpoint_every: int = 10
    seed: int = 7
    step_delay: float = 0.05
    # seconds between a checkpoint's files and its manifest: an experiment can then interrupt
    # a checkpoint write for certain (0 = no pause)
    checkpoint_commit_delay: float = 0.0
    # with a node-local checkpoint directory (the agent's disk): every n-th checkpoint also
    # goes to the object store, and a checkpoint's last file waits this long for its fsync
    checkpoint_upload_every: int = 1
    checkpoint_sync_delay: float = 0.0
    # also log params and the loss per step to the environment's tracking server (MLflow:
    # controlplane/workload/tracking.py); a platform without one refuses it
    tracking: bool = False
    cpu: int = 1
    accelerators: int = 0
    regions: tuple[str, ...] | None = None
    dataset: str | None = None
    max_retries: int = 3
    timeout_seconds: int = 600
    queue: str = "default"
    name: str = "gameday-train"


@dataclass(frozen=True)
class SubmitRequest:
    workload: Workload
    idempotency_key: str


@dataclass(frozen=True)
class Ack:
    operation_id: str
    idempotency_key: str
    status: int  # 201 created, 200 duplicate (same operation)
    acked_at: str
    request: dict[str, Any] | None = None  # the body sent: a client can replay it after a restore


@dataclass(frozen=True)
class StoredOperation:
    """What the store knows of one operation, for reconciling it with object storage and the
    client ledgers after a database restore."""

    id: str
    project: str
    state: str
    attempt_count: int
    idempotency_key: str | None


@dataclass
class OperationView:
    id: str
    state: str
    state_reason: str | None = None
    pending_reason: str | None = None
    result: dict[str, Any] | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return self.state in ("succeeded", "failed", "canceled")


# Logical fault targets experiments name, so one experiment runs on any platform:
#   "api-replica"       one replica/instance of the platform's API server
#   "pool:<name>"       the workers/agents of one capacity pool (the env's pool name)
# Anything else is passed to the environment's fault driver unchanged (e.g. "primary/postgres").


@runtime_checkable
class PlatformAdapter(Protocol):
    name: str

    def submit(self, req: SubmitRequest) -> Ack: ...
    def get(self, operation_id: str, *, timeline: bool = False) -> OperationView: ...
    def list(self, state: str | None = None, limit: int = 100) -> list[OperationView]: ...
    def cancel(self, operation_id: str, reason: str = "") -> OperationView: ...
    def healthy(self) -> tuple[bool, str]: ...  # can it accept work right now, and why not
    def results_location(self, operation_id: str) -> str: ...  # where artifacts live (URI)
    # snapshot/*.jsonl of the operations created at or after ``since`` (None: all); counts
    def snapshot(self, out_dir: Path, since: datetime | None = None) -> dict[str, int]: ...
    def components(self) -> dict[str, str]: ...  # faultable components -> what they are
    def fault_targets(self) -> dict[str, str]: ...  # logical role -> environment component
    def applicability(self, experiment: str) -> str | None: ...  # None, or why it does not apply
