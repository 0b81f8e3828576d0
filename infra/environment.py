"""What the runner, the probes and the actions see of an environment (local or cloud), and the
fault-primitive interface every environment's driver implements.

An experiment names *what* to break (``kill api replica``) and the environment's driver decides
*how* (SIGKILL a local process, delete a pod, reboot an RDS instance with failover). Every
driver method returns when the fault is in effect (or undone) and returns a small dict that
goes into the Chaos Toolkit journal. Every inverse is idempotent: rollbacks call them
unconditionally. Every fault is recorded on the environment's fault timeline
(docs/CONTRACTS.md section 4).

Implementations: infra/local/env.py (LocalEnvironment, driver = its FaultInjector) and
infra/cloud/env.py (CloudEnvironment, driver = RecordedCloudFaults).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

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


@runtime_checkable
class Agent(Protocol):
    name: str
    pool: str
    region: str


@runtime_checkable
class Environment(Protocol):
    """One environment a game day runs against."""

    name: str
    state_dir: Path

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


class EnvironmentUnavailable(Exception):
    """The environment cannot be opened (message says which and why)."""


def open_environment(name: str, home: Path | None, *, cloud_target: Path | None = None,
                     cloud_state_dir: Path | None = None, allow_prod: bool = False
                     ) -> Environment:
    """An environment that exists already: the cloud stack a target file describes, or the
    local environment ``name`` under ``home``. What experiments' actions and probes open."""
    if cloud_target is not None:
        from infra.cloud.env import CloudEnvError, CloudEnvironment

        try:
            return CloudEnvironment.from_target(cloud_target, name, home=home,
                                                state_dir=cloud_state_dir, allow_prod=allow_prod)
        except CloudEnvError as exc:
            raise EnvironmentUnavailable(str(exc)) from None
    from infra.local.env import LocalEnvironment
    from infra.local.errors import EnvError

    try:
        return LocalEnvironment.load(name, home)
    except EnvError as exc:
        raise EnvironmentUnavailable(str(exc)) from None


def poll(check: Callable[[], bool], timeout: float, interval: float) -> float | None:
    """Seconds until ``check()`` first held, or None when it did not within ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(interval)
    return None
