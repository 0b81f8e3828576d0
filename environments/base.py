"""What the runner, the probes and the actions see of an environment (local or cloud), and the
fault-primitive interface every environment's driver implements.

An experiment names *what* to break (``kill api replica``) and the environment's driver decides
*how* (SIGKILL a local process, delete a pod, reboot an RDS instance with failover). Every
driver method returns when the fault is in effect (or undone) and returns a small dict that
goes into the Chaos Toolkit journal. Every inverse is idempotent: rollbacks call them
unconditionally. Every fault is recorded on the environment's fault timeline
(docs/CONTRACTS.md section 4).

Implementations: environments/local/env.py (LocalEnvironment, driver = its FaultInjector) and
environments/cloud/env.py (CloudEnvironment, driver = RecordedCloudFaults).

Where the two differ for a game day, the runner asks (``EnvironmentKind`` before one is open,
``Environment`` after); it never tests an environment's name. ``ENVIRONMENTS`` is the one list
of the names ``--env`` takes and the kind that serves each.

The types themselves live in environments/environment_types.py, which both kinds import (so neither
imports this module, which imports them to pick one); every name there is re-exported here.
"""

from __future__ import annotations

from pathlib import Path

from environments.environment_types import (
    ENVIRONMENTS,
    Agent,
    CredentialDriver,
    Environment,
    EnvironmentKind,
    EnvironmentRefused,
    EnvironmentUnavailable,
    EvidenceNeeds,
    FaultDriver,
    FaultResult,
    OpenRun,
    RolloutDriver,
    RunRequest,
    poll,
)

__all__ = [
    "ENVIRONMENTS",
    "Agent",
    "CredentialDriver",
    "Environment",
    "EnvironmentKind",
    "EnvironmentRefused",
    "EnvironmentUnavailable",
    "EvidenceNeeds",
    "FaultDriver",
    "FaultResult",
    "OpenRun",
    "RolloutDriver",
    "RunRequest",
    "environment_kind",
    "open_environment",
    "poll",
]


def environment_kind(env: str) -> EnvironmentKind:
    """The class serving ``env`` (a name of ENVIRONMENTS); an unknown name is refused."""
    kind = ENVIRONMENTS.get(env)
    if kind == "cloud":
        from environments.cloud.env import CloudEnvironment

        return CloudEnvironment
    if kind == "local":
        from environments.local.env import LocalEnvironment

        return LocalEnvironment
    raise EnvironmentRefused(f"unknown env {env!r}; envs: {', '.join(ENVIRONMENTS)}")


def open_environment(name: str, home: Path | None, *, cloud_target: Path | None = None,
                     cloud_state_dir: Path | None = None, allow_prod: bool = False
                     ) -> Environment:
    """An environment that exists already: the cloud stack a target file describes, or the
    local environment ``name`` under ``home``. What experiments' actions and probes open."""
    if cloud_target is not None:
        from environments.cloud.env import CloudEnvError, CloudEnvironment

        try:
            return CloudEnvironment.from_target(cloud_target, name, home=home,
                                                state_dir=cloud_state_dir, allow_prod=allow_prod)
        except CloudEnvError as exc:
            raise EnvironmentUnavailable(str(exc)) from None
    from environments.local.env import LocalEnvironment
    from environments.local.errors import EnvError

    try:
        return LocalEnvironment.load(name, home)
    except EnvError as exc:
        raise EnvironmentUnavailable(str(exc)) from None
