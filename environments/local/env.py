"""The local environment: bring the whole platform up on one machine, check it, tear it down.

Usage from Python (tests, the chaos layer)::

    from environments.local.env import LocalEnvironment

    with LocalEnvironment.running("local") as env:       # up ... down
        env.faults.kill("api-1")
        env.faults.start("api-1")

    env = LocalEnvironment.load("local")                  # attach to a running environment
    env.faults.failover_db()

State lives in ``<home>/.gameday/envs/<name>`` (``home`` = ``$GAMEDAY_HOME`` or the current
directory): ``env.json`` (endpoints, tokens, component specs), ``faults.jsonl`` (fault
timeline), ``logs/<component>.log``, ``run/<component>.json`` (pid records) and data dirs.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from environments.environment_types import (
    EnvironmentUnavailable,
    EvidenceNeeds,
    OpenRun,
    RunRequest,
)
from environments.local import bringup, for_run, orphans, procs, serving, storage, tracking
from environments.local.backup import DatabaseBackups
from environments.local.bringup import (
    controlplane_commands,
    status_of,
    up_controlplane,
    up_infra,
)
from environments.local.database import LocalDatabase
from environments.local.errors import AlreadyRunning, EnvError, NotRunning
from environments.local.fault_parts import fault_driver
from environments.local.faults import FaultInjector
from environments.local.pg_files import db_root_for
from environments.local.platform import local_platform
from environments.local.processes import OWNER_ENV, Processes
from environments.local.releases import Releases
from environments.local.spec import ComponentSpec
from environments.local.state import EnvState, state_dir_for
from environments.local.topology import DEFAULT_AGENTS, AgentSpec

__all__ = ["LocalEnvironment", "state_dir_for"]

Reporter = Callable[[str], None]


class LocalEnvironment:
    """Composition root of one local environment (one state directory): it builds its
    components and holds them; each owns its state (docs/local-environment.md, "Components
    of the code"). ``state``: env.json and the state directory; ``processes``: the supervisor,
    pid records, health; ``db``: the database cluster; ``releases``; ``faults``: the fault
    driver over the fault components; ``backups``."""

    remote = False
    budget_source = "archive"  # its Prometheus lives and dies with it: the run history
    durability_stream = True  # with a platform that has a held queue (platforms/registry.py)
    sigterm_is_interrupt = False
    database_backups_here = True

    def __init__(self, name: str = "local", home: Path | None = None,
                 agents: tuple[AgentSpec, ...] = DEFAULT_AGENTS,
                 storage_faults: bool | None = None, serving: bool | None = None,
                 tracking: bool | None = None) -> None:
        self.name = name
        self.state_dir = state_dir_for(name, home)
        self.state = EnvState(name, self.state_dir, agents)
        self.topology = agents  # what `up` starts; ``agents``: what runs (env.json once loaded)
        self.processes = Processes(self.state)
        self.db = LocalDatabase(self.state)
        self._faults: FaultInjector | None = None
        if self.state.exists():
            self.state.load()
        # whether `up` puts each database member's data directory on a faultfs mount
        # (environments/local/storage.py); None: as env.json says (off for a new environment)
        self.storage_faults = (bool(self.info.get("storage_faults")) if storage_faults is None
                               else storage_faults)
        # whether `up` starts the model servers (environments/local/serving.py); None: as
        # env.json says (off for a new environment)
        self.serving = bool(self.info.get("serving")) if serving is None else serving
        # whether `up` starts MLflow's tracking server (environments/local/tracking.py); None:
        # as env.json says (off for a new environment)
        self.tracking = (bool(self.info.get("tracking")) if tracking is None else tracking)

    # -- its record (environments/local/state.py) --------------------------------------------------
    @property
    def info(self) -> dict[str, Any]:
        return self.state.info

    @info.setter
    def info(self, value: dict[str, Any]) -> None:
        self.state.info = value

    @property
    def components(self) -> dict[str, ComponentSpec]:
        return self.state.components

    @components.setter
    def components(self, value: dict[str, ComponentSpec]) -> None:
        self.state.components = value

    @property
    def agents(self) -> tuple[AgentSpec, ...]:
        return self.state.agents

    @property
    def env_file(self) -> Path:
        return self.state.env_file

    @property
    def timeline_file(self) -> Path:
        return self.state.timeline_file

    def log_file(self, component: str) -> Path:
        return self.state.log_file(component)

    @property
    def endpoints(self) -> dict[str, Any]:
        return self.state.endpoints

    @property
    def tokens(self) -> dict[str, Any]:
        return self.state.tokens

    def note(self, what: str, details: dict[str, Any] | None = None) -> None:
        self.state.note(what, details)

    def zones(self) -> dict[str, dict[str, list[str]]]:
        return self.state.zones()

    def zone_of(self, component: str) -> str | None:
        return self.state.zone_of(component)

    @classmethod
    def load(cls, name: str = "local", home: Path | None = None) -> LocalEnvironment:
        env = cls(name, home)
        if not env.info:
            raise NotRunning(f"environment {name!r} has no state at {env.state_dir}: "
                             "run `gameday env up` first")
        return env

    @classmethod
    @contextmanager
    def running(cls, name: str = "local", home: Path | None = None, *, purge: bool = False,
                reporter: Reporter | None = None, **kwargs: Any) -> Iterator[LocalEnvironment]:
        """Bring an environment up for the duration of a ``with`` block, then down."""
        env = cls(name, home, **kwargs)
        env.up(reporter=reporter)
        try:
            yield env
        finally:
            env.down(purge=purge)

    # -- a game day on it (environments/base.py EnvironmentKind) ----------------------------
    @classmethod
    def refusal(cls, req: RunRequest) -> str | None:
        return None

    @classmethod
    def dry_run(cls, req: RunRequest) -> Iterator[str]:
        return for_run.dry_run(cls(req.env_name, req.home), req)

    @classmethod
    def prometheus_url(cls, req: RunRequest) -> str:
        env = cls(req.env_name, req.home)
        if not env.is_running():
            raise EnvironmentUnavailable(f"local environment {req.env_name!r} is not running "
                                         "(no Prometheus)")
        return str(env.endpoints["prometheus"])

    @classmethod
    def open_for_run(cls, req: RunRequest, new_run: Callable[[], tuple[str, Path]],
                     say: Callable[[str], None]) -> AbstractContextManager[OpenRun]:
        """Brought up when it is not running (and down again afterwards unless kept), then
        held by the game-day lock file in its state directory."""
        return for_run.hold_for_run(cls(req.env_name, req.home),
                                    lambda: cls.load(req.env_name, req.home), req, new_run, say)

    def run_info(self) -> dict[str, Any]:
        return {}

    def chaos_env(self) -> dict[str, str]:
        return {}  # chaos/context.py finds it by name under GAMEDAY_HOME

    @property
    def evidence_needs(self) -> EvidenceNeeds:
        return EvidenceNeeds()  # everything is on this machine: nothing is out of reach

    # -- its parts --------------------------------------------------------------------------
    @property
    def faults(self) -> FaultInjector:
        """The fault driver (environments/base.py FaultDriver) over the fault components."""
        if self._faults is None:
            self._faults = fault_driver(self.state, self.processes, self.db)
            self._faults.backups = DatabaseBackups(self.state, self.processes, self.db,
                                                   self._faults)
        return self._faults

    @property
    def driver(self) -> FaultInjector:
        return self.faults

    @property
    def backups(self) -> DatabaseBackups:
        """Base backups, losing the database and the restore order (environments/local/backup.py)."""
        return self.faults.backups  # type: ignore[return-value]

    @property
    def releases(self) -> Releases:
        return self.faults.releases  # type: ignore[return-value]

    def applicability(self, experiment: str, requires: Sequence[str] = ()) -> str | None:
        """Every experiment is written for the local topology; one that declares it needs the
        storage layer (x-gameday ``requires: [storage-faults]``) needs it started."""
        if storage.REQUIREMENT in requires and not storage.disks(self.components):
            return f"needs the storage fault layer: {storage.HINT}"
        if serving.REQUIREMENT in requires and not serving.replicas(self.components):
            return f"needs model serving: {serving.HINT}"
        if tracking.REQUIREMENT in requires and tracking.SERVER not in self.components:
            return f"needs MLflow's tracking server: {tracking.HINT}"
        return None

    # -- what callers ask of its processes, database and releases ---------------------------
    def main_pid(self, component: str) -> int | None:
        return self.processes.main_pid(component)

    def component_pids(self, component: str, *, postgres_only: bool = False) -> list[int]:
        return self.processes.component_pids(component, postgres_only=postgres_only)

    def spawn(self, component: str) -> int:
        return self.processes.spawn(component)

    def check(self, component: str, timeout: float = 1.0) -> tuple[bool, str]:
        return self.processes.check(component, timeout)

    def wait_healthy(self, components: list[str], timeout: float, reporter: Reporter | None = None) -> None:
        self.processes.wait_healthy(components, timeout, reporter)

    def db_writable(self, timeout: float = 2.0) -> bool:
        return self.db.writable(timeout)

    def wait_db_writable(self, timeout: float) -> float:
        return self.db.wait_writable(timeout)

    def set_defects(self, names: list[str] | tuple[str, ...]) -> list[str]:
        return self.releases.set_defects(names)

    def release_order(self) -> list[str]:
        return self.releases.release_order()

    def release_of(self, component: str) -> str:
        return self.releases.release_of(component)

    # -- up ---------------------------------------------------------------------------------
    def is_running(self) -> bool:
        if not self.info:
            return False
        return self.processes.supervisor.alive() or bool(self.processes.running_components())

    def preflight(self, platform: str = "controlplane") -> list[str]:
        return bringup.preflight(platform)

    def up(self, reporter: Reporter | None = None, *, infra_only: bool = False,
           timeout: float = 60.0, platform: str = "controlplane") -> dict[str, Any]:
        """Start every component and wait until all are healthy; tear down on any failure.

        ``platform`` names the platform under test (platforms/registry.py): ``controlplane``
        (ours, the default) or e.g. ``prefect``; its local module (environments/local/platform.py)
        adds its components beside the shared ones."""
        say = reporter or (lambda _msg: None)
        started = time.monotonic()
        if self.is_running():
            raise AlreadyRunning(
                f"environment {self.name!r} is already running (state {self.state_dir}); "
                f"use `gameday env status` or `gameday env down` first")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o755)
        orphans.remove_orphans(orphans.SYSTEM_DB_ROOT, say)
        if not self.info:  # no env.json: a database left here has lost its passwords
            orphans.remove_stale(db_root_for(self.state_dir, self.name), self.state_dir, say)
        problems = self.preflight(platform)
        if self.storage_faults:
            problems += storage.preflight()
        if self.serving:
            problems += serving.preflight()
        if self.tracking and tracking.missing():
            problems.append(f"--tracking: {tracking.missing()}")
        if self.info and bool(self.info.get("storage_faults")) != self.storage_faults:
            # the data directories are in other places with and without the storage layer
            was = "with" if self.info.get("storage_faults") else "without"
            problems.append(f"this environment was created {was} --storage-faults: start it "
                            "the same way, or `gameday env down --purge` it first")
        if problems:
            raise EnvError("cannot start the local environment:\n  " + "\n  ".join(problems))

        hooks = local_platform(platform)
        commands = set() if infra_only or not hooks.CONTROLPLANE else controlplane_commands()
        # kept across up/down so a stopped environment restarts on its own data
        db_root = Path(self.info.get("db_root") or db_root_for(self.state_dir, self.name))
        with_cp = bringup.plan(self.state, hooks, platform, commands, self.topology, db_root,
                               self.storage_faults, self.serving, self.tracking)
        self.state.save()
        self.note("env_up", {"controlplane": with_cp, "agents": [a.name for a in self.agents]})
        try:
            self.processes.start_supervisor()
            say("supervisor running")
            up_infra(self.state, self.processes, self.db, say, timeout)
            if self.tracking:  # before the control plane: its agents log to it
                self.info["tracking_start_seconds"] = tracking.up(
                    self.processes, self.endpoints["admin_dsn"],
                    self.info["tracking_db_password"], say, timeout)
            if with_cp:
                up_controlplane(self.state, self.processes, self.db, say, timeout)
            hooks.up(self, say, timeout)
            standby = self.db.wait_sync_standby(storage.db_timeout(self.components, timeout))
            say(f"synchronous standby: {standby}")
            if not os.environ.get(OWNER_ENV):
                self.processes.supervisor.call("detach")  # outlives `up`: stopped by `down`
        except BaseException:
            say("start failed: tearing down what was started")
            self.processes.teardown()
            self.info["status"] = "failed"
            self.state.save()
            raise
        self.info["status"] = "up"
        self.info["up_seconds"] = round(time.monotonic() - started, 2)
        self.state.save()
        return self.status()

    def down(self, purge: bool = False) -> dict[str, Any]:
        """Stop everything (restoring every active fault first); keep state unless ``purge``."""
        started = time.monotonic()
        if not self.info and not self.state_dir.exists():
            raise NotRunning(f"environment {self.name!r} has no state at {self.state_dir}")
        if self.info:
            self.faults.close_all(reason="down")
        # asked only when it matters: members on faultfs disks stop in order (storage.py)
        leader = self.db.leader() if self.info and self.storage_faults else None
        left = self.processes.teardown(leader=leader)
        left += procs.marked_processes(self.state_dir)
        if left:
            raise EnvError(f"processes survived teardown: {sorted(set(left))}")
        seconds = round(time.monotonic() - started, 2)
        if self.info:
            self.note("env_down", {"seconds": seconds, "purge": purge})
            self.info["status"] = "down"
            self.info["down_seconds"] = seconds
            self.state.save()
        if purge:
            db_root = Path(self.info.get("db_root") or self.state_dir)
            for root in {db_root, self.state_dir}:  # never delete through a mount
                storage.detach_stale_mounts(root)
            if db_root != self.state_dir:
                shutil.rmtree(db_root, ignore_errors=True)
            shutil.rmtree(self.state_dir)
        return {"name": self.name, "down_seconds": seconds, "purged": purge}

    # -- status -----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """env.json plus live health of each component (secrets left out)."""
        return status_of(self.state, self.processes, self.db,
                         self.faults.active() if self.info else {})
