"""The types the runner, the probes and the actions see of an environment (local or cloud),
and the fault-primitive interface every environment's driver implements: the ``Environment``,
``EnvironmentKind`` and ``FaultDriver`` protocols, what a run asks (``RunRequest``) and holds
(``OpenRun``), ``ENVIRONMENTS``. Both kinds import this module; ``environments/base.py`` (which
picks the kind serving a name) re-exports every name here, and is what callers import.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from controlplane.serving.rollout import Policy

FaultResult = dict[str, Any]


@runtime_checkable
class FaultDriver(Protocol):
    name: str  # "local" | "kubernetes+aws" | ...

    # processes / replicas -------------------------------------------------------------
    def kill(self, target: str) -> FaultResult: ...  # e.g. "api-1", "agent:cpu-1", "db-primary"
    def hang(self, target: str) -> FaultResult: ...
    def resume(self, target: str) -> FaultResult: ...
    def stop(self, target: str) -> FaultResult: ...
    def start(self, target: str) -> FaultResult: ...

    # database ---------------------------------------------------------------------------
    def failover_db(self) -> FaultResult: ...

    # dependencies -----------------------------------------------------------------------
    def artifact_store_unreachable(self) -> FaultResult: ...
    def artifact_store_restore(self) -> FaultResult: ...
    def registry_unreachable(self) -> FaultResult: ...
    def registry_restore(self) -> FaultResult: ...

    # capacity / network -----------------------------------------------------------------
    def withdraw_pool(self, pool: str) -> FaultResult: ...
    def restore_pool(self, pool: str) -> FaultResult: ...
    def partition_agent(self, agent: str) -> FaultResult: ...
    def heal_agent(self, agent: str) -> FaultResult: ...
    def partition_database(self, component: str) -> FaultResult: ...  # one API replica only
    def heal_database(self, component: str) -> FaultResult: ...

    # zones ------------------------------------------------------------------------------
    def zone_outage(self, zone: str) -> FaultResult: ...  # everything in one zone at once
    def restore_zone(self, zone: str) -> FaultResult: ...

    def restore_all(self) -> list[str]: ...  # undo every fault this driver knows is active


class CredentialDriver(Protocol):
    """A driver that can rotate the platform's credentials (local environment only so far)."""

    def rotate_credentials(self, project: str | None = None) -> FaultResult: ...
    def revoke_retired_credentials(self) -> FaultResult: ...
    # {"refused": bool, per credential and replica: why}; polls up to ``within`` seconds
    def retired_credentials_refused(self, within: float) -> dict[str, Any]: ...


class RolloutDriver(Protocol):
    """A driver that can roll a model version out through its rollout controller (local
    environment with model serving only so far): returns how the rollout ended."""

    def rollout(self, version: str, policy: Policy, step_seconds: float,
                expect: str | None = None) -> dict[str, Any]: ...


@runtime_checkable
class Agent(Protocol):
    name: str
    pool: str
    region: str


# Every name ``--env`` takes, in the order the CLI lists them, and the kind serving it.
ENVIRONMENTS: dict[str, Literal["local", "cloud"]] = {
    "local": "local", "dev": "cloud", "staging": "cloud", "prod": "cloud"}


@dataclass(frozen=True)
class RunRequest:
    """What a game day asks of an environment before one is open (``gameday run``'s options)."""

    env: str  # a name of ENVIRONMENTS
    env_name: str = "local"  # a local environment's own name (its state dir under home)
    home: Path | None = None
    target: Path | None = None  # a cloud environment's target file
    allow_prod: bool = False
    platform: str = "controlplane"
    keep_env: bool = True  # keep an environment this run brought up


@dataclass(frozen=True)
class EvidenceNeeds:
    """What collecting a run's evidence must know of the environment (gameday/ collects)."""

    # The runner's Prometheus queries (by key) this environment answers differently: its own
    # query for the key, or None where the metric does not exist there
    queries: Mapping[str, str | None] = field(default_factory=dict)
    # None: everything is collected, no collection-gaps.json. Otherwise what never is there,
    # and why: the run directory then records every gap in collection-gaps.json.
    known_gaps: Mapping[str, str] | None = None
    snapshot_source: str = ""  # named when the store snapshot fails (with known_gaps)
    # (bucket, region): the run's objects are listed from AWS S3 (IAM), not an endpoint URL
    aws_objects: tuple[str | None, str] | None = None
    active_faults_at: str = ""  # where the faults a failed restore left active are recorded


@dataclass
class OpenRun:
    """An environment held for one game day: its run id and directory, and the lock."""

    env: Environment
    run_id: str
    run_dir: Path
    lock: Any = None


class EnvironmentRefused(Exception):
    """A game day cannot start on this environment (message says why; nothing was touched
    beyond what the message says)."""


class EnvironmentKind(Protocol):
    """What the runner asks of an environment class before one is open."""

    budget_source: str  # where the budget check reads by default: "prometheus" | "archive"
    durability_stream: bool  # the durability stream can run against it
    sigterm_is_interrupt: bool  # runs in a pod: SIGTERM (a deadline, a drain) is a Ctrl-C
    # its database's base backups are taken and restored on this machine (chaos/restore.py)
    database_backups_here: bool

    @classmethod
    def refusal(cls, req: RunRequest) -> str | None: ...  # before anything: why not
    @classmethod
    def dry_run(cls, req: RunRequest) -> Iterator[str]: ...  # raises EnvironmentUnavailable
    @classmethod
    def prometheus_url(cls, req: RunRequest) -> str: ...  # raises EnvironmentUnavailable
    @classmethod
    def open_for_run(cls, req: RunRequest, new_run: Callable[[], tuple[str, Path]],
                     say: Callable[[str], None]) -> AbstractContextManager[OpenRun]: ...


@runtime_checkable
class Environment(Protocol):
    """One environment a game day runs against."""

    name: str
    state_dir: Path
    remote: bool  # not on this machine: the load is aimed at it on purpose (allow_remote)

    @property
    def endpoints(self) -> dict[str, Any]: ...  # api, prometheus, fault_timeline, s3, ...
    @property
    def tokens(self) -> dict[str, Any]: ...  # projects, agent, admin
    @property
    def driver(self) -> FaultDriver: ...
    @property
    def agents(self) -> Sequence[Agent]: ...
    @property
    def components(self) -> Mapping[str, Any]: ...  # what wait_healthy can wait for

    def status(self) -> dict[str, Any]: ...  # {"healthy", "components": {..}, "active_faults"}
    def wait_healthy(self, components: list[str], timeout: float) -> None: ...
    def db_writable(self, timeout: float = 2.0) -> bool: ...
    def wait_db_writable(self, timeout: float) -> float: ...  # seconds it took; raises if not
    def note(self, what: str, details: dict[str, Any] | None = None) -> None: ...  # timeline
    # None, or why it cannot run; ``requires``: what the experiment declares it needs
    # (x-gameday ``requires``, e.g. ``storage-faults``)
    def applicability(self, experiment: str, requires: Sequence[str] = ()) -> str | None: ...
    # what a run records of it in run.json (beside env and environment): where it points
    def run_info(self) -> dict[str, Any]: ...
    # what the experiments' Chaos Toolkit processes need to open it (chaos/context.py)
    def chaos_env(self) -> dict[str, str]: ...
    @property
    def evidence_needs(self) -> EvidenceNeeds: ...


class EnvironmentUnavailable(Exception):
    """The environment cannot be opened (message says which and why)."""


def poll(check: Callable[[], bool], timeout: float, interval: float) -> float | None:
    """Seconds until ``check()`` first held, or None when it did not within ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(interval)
    return None
