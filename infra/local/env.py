"""The local environment: bring the whole platform up on one machine, check it, tear it down.

Usage from Python (tests, the chaos layer)::

    from infra.local.env import LocalEnvironment

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

import dataclasses
import importlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
import httpx

from infra.environment_types import (
    EnvironmentRefused,
    EnvironmentUnavailable,
    EvidenceNeeds,
    OpenRun,
    RunRequest,
)
from infra.local import node_disk, orphans, procs, storage
from infra.local.components import build_components
from infra.local.configs import gameday_targets_file
from infra.local.database import LocalDatabase
from infra.local.errors import (
    AlreadyRunning,
    ComponentUnhealthy,
    EnvError,
    NotRunning,
)
from infra.local.pg_files import PG_BIN, app_dsn, db_root_for, superuser_dsn
from infra.local.ports import allocate_ports
from infra.local.spec import ComponentSpec, Group
from infra.local.state import EnvState
from infra.local.supervisor import SupervisorClient, SupervisorError
from infra.local.topology import (
    API_ZONES,
    BUCKET,
    DB_ZONES,
    DEFAULT_AGENTS,
    DEFAULT_QUEUES,
    IMAGE_REPOSITORY,
    IMAGE_TAG,
    AgentSpec,
    Secrets,
    port_names,
    zone_map,
)
from infra.schedule import GameDayLock, ScheduleError
from infra.timeline import utcnow

Reporter = Callable[[str], None]
# A process that owns every environment started under it for its whole life (a test session):
# when it dies, the supervisor kills everything, even if that process is killed hard.
OWNER_ENV = "GAMEDAY_OWNER_PID"
CONTROLPLANE_COMMANDS = {"migrate", "seed", "api", "reconciler"}


def default_home() -> Path:
    return Path(os.environ.get("GAMEDAY_HOME") or os.getcwd())


def state_dir_for(name: str, home: Path | None = None) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise EnvError(f"environment name {name!r} is invalid: use letters, digits, '-' or '_'")
    return (home or default_home()).resolve() / ".gameday" / "envs" / name


def controlplane_commands() -> set[str]:
    """Which `gameday controlplane` subcommands exist in this checkout.

    Only a checkout without the control plane has none: a control plane whose CLI fails to
    import is an error, not an environment quietly started without its API, reconciler and
    agents (which then measured and passed as if it were whole)."""
    try:
        module = importlib.import_module("controlplane.cli")
    except ModuleNotFoundError as exc:
        if exc.name not in ("controlplane", "controlplane.cli"):
            raise EnvError(f"the control plane cannot be imported: {exc}") from exc
        return set()
    except ImportError as exc:
        raise EnvError(f"the control plane cannot be imported: {exc}") from exc
    group = getattr(module, "group", None)
    if not isinstance(group, click.Group):
        return set()
    with click.Context(group) as ctx:  # list_commands sees lazily mounted commands too
        return set(group.list_commands(ctx))


def tail(path: Path, lines: int = 25) -> str:
    try:
        data = path.read_bytes()[-16384:]
    except FileNotFoundError:
        return "(no log file)"
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


class LocalEnvironment:
    """Composition root of one local environment (one state directory)."""

    remote = False
    budget_source = "archive"  # its Prometheus lives and dies with it: the run history
    durability_stream = True  # with a platform that has a held queue (platforms/registry.py)
    sigterm_is_interrupt = False

    def __init__(self, name: str = "local", home: Path | None = None,
                 agents: tuple[AgentSpec, ...] = DEFAULT_AGENTS,
                 storage_faults: bool | None = None) -> None:
        self.name = name
        self.state_dir = state_dir_for(name, home)
        self.state = EnvState(name, self.state_dir)
        self.topology = agents  # what `up` starts
        self.agents = agents  # what is running (from env.json once loaded)
        self.info: dict[str, Any] = {}
        self.components: dict[str, ComponentSpec] = {}
        self._faults: Any = None
        if self.env_file.exists():
            self._read_info()
        # whether `up` puts each database member's data directory on a faultfs mount
        # (infra/local/storage.py); None: as env.json says (off for a new environment)
        self.storage_faults = (bool(self.info.get("storage_faults")) if storage_faults is None
                               else storage_faults)

    # -- files (infra/local/state.py) ---------------------------------------------------------
    @property
    def env_file(self) -> Path:
        return self.state.env_file

    @property
    def timeline_file(self) -> Path:
        return self.state.timeline_file

    def log_file(self, component: str) -> Path:
        return self.state.log_file(component)

    def _read_info(self) -> None:
        self.info = self.state.read()
        self.components = {n: ComponentSpec.from_json(c) for n, c in self.info["components"].items()}
        self.agents = tuple(AgentSpec(**{k: (tuple(v) if k == "datasets" else v)
                                         for k, v in a.items() if k != "accelerator_type"})
                            for a in self.info.get("agents", []))

    def _write_info(self) -> None:
        self.info["components"] = {n: c.to_json() for n, c in self.components.items()}
        self.state.write(self.info)

    def save_info(self) -> None:
        """Write env.json after a change of ``info`` (e.g. rotated secrets)."""
        self._write_info()

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

    # -- a game day on it (infra/environment.py EnvironmentKind) ----------------------------
    @classmethod
    def refusal(cls, req: RunRequest) -> str | None:
        return None

    @classmethod
    def dry_run(cls, req: RunRequest) -> Iterator[str]:
        env = cls(req.env_name, req.home)
        running = env.is_running()
        state = "running (would be reused)" if running else "not running (would be brought up)"
        yield f"environment {req.env_name!r} at {env.state_dir}: {state}"
        if running:
            eps = env.endpoints
            yield (f"targets: API {eps.get('api')}, DB {eps.get('patroni')}, "
                   f"S3 {eps.get('s3')}, registry {eps.get('registry')}")

    @classmethod
    def prometheus_url(cls, req: RunRequest) -> str:
        env = cls(req.env_name, req.home)
        if not env.is_running():
            raise EnvironmentUnavailable(f"local environment {req.env_name!r} is not running "
                                         "(no Prometheus)")
        return str(env.endpoints["prometheus"])

    @classmethod
    @contextmanager
    def open_for_run(cls, req: RunRequest, new_run: Callable[[], tuple[str, Path]],
                     say: Callable[[str], None]) -> Iterator[OpenRun]:
        """Brought up when it is not running (and down again afterwards unless kept), then
        held by the game-day lock file in its state directory."""
        env = cls(req.env_name, req.home)
        started_env = False
        if not env.is_running():
            say(f"bringing up environment {req.env_name!r} ...")
            try:
                env.up(reporter=lambda msg: say(f"  {msg}"), platform=req.platform)
            except EnvError as exc:
                raise EnvironmentRefused(f"the environment did not come up: {exc}") from None
            started_env = True
        env = cls.load(req.env_name, req.home)
        running = env.info.get("platform", "controlplane")
        if running != req.platform:
            raise EnvironmentRefused(
                f"environment {req.env_name!r} runs platform {running!r}, not "
                f"{req.platform!r}: `gameday env down` it first or use another --env-name")
        run_id, run_dir = new_run()
        lock = GameDayLock(env.state_dir / "gameday.lock")
        try:
            lock.acquire({"run_id": run_id, "run_dir": str(run_dir)})
        except ScheduleError as exc:
            raise EnvironmentRefused(str(exc)) from None
        try:
            yield OpenRun(env, run_id, run_dir, lock)
        finally:
            lock.release()
            if started_env and not req.keep_env:
                env.down()

    def run_info(self) -> dict[str, Any]:
        return {}

    def chaos_env(self) -> dict[str, str]:
        return {}  # chaos/context.py finds it by name under GAMEDAY_HOME

    @property
    def evidence_needs(self) -> EvidenceNeeds:
        return EvidenceNeeds()  # everything is on this machine: nothing is out of reach

    @property
    def faults(self) -> Any:
        from infra.local.fault_parts import local_fault_parts
        from infra.local.faults import FaultInjector

        if self._faults is None:
            self._faults = FaultInjector(self, local_fault_parts)
        return self._faults

    def applicability(self, experiment: str, requires: Sequence[str] = ()) -> str | None:
        """Every experiment is written for the local topology; one that declares it needs the
        storage layer (x-gameday ``requires: [storage-faults]``) needs it started."""
        if storage.REQUIREMENT in requires and not storage.disks(self):
            return f"needs the storage fault layer: {storage.HINT}"
        return None

    @property
    def driver(self) -> Any:
        """The fault driver (infra/environment.py FaultDriver): the injector itself."""
        return self.faults

    # -- endpoints --------------------------------------------------------------------------
    @property
    def endpoints(self) -> dict[str, Any]:
        return self.info.get("endpoints", {})

    @property
    def tokens(self) -> dict[str, Any]:
        return self.info.get("tokens", {})

    @property
    def supervisor(self) -> SupervisorClient:
        return SupervisorClient(self.state_dir)

    # -- process records --------------------------------------------------------------------
    def pid_record(self, component: str) -> dict[str, Any] | None:
        return self.state.pid_record(component)

    def main_pid(self, component: str) -> int | None:
        record = self.pid_record(component)
        if record and procs.is_alive(record["pid"], record.get("start_ticks")):
            return int(record["pid"])
        return None

    def postmaster_pid(self, component: str) -> int | None:
        """The postmaster of a Patroni member (it runs outside Patroni's process tree)."""
        spec = self.components[component]
        try:
            first = (Path(spec.labels["data_dir"]) / "postmaster.pid").read_text().split("\n", 1)[0]
            pid = int(first)
        except (FileNotFoundError, PermissionError, ValueError, KeyError):
            return None
        info = procs.read_stat(pid)
        if info is None or not procs.is_alive(pid) or "postgres" not in info.comm:
            return None
        return pid

    def component_pids(self, component: str, *, postgres_only: bool = False) -> list[int]:
        """Every live process of a component: main pid, descendants, and for Patroni its postgres."""
        pids: list[int] = []
        main = self.main_pid(component)
        if main and not postgres_only:
            pids += [main, *procs.descendants(main)]
        if self.components[component].kind == "patroni":
            postmaster = self.postmaster_pid(component)
            if postmaster:
                pids += [postmaster, *procs.descendants(postmaster)]
        return sorted(set(pids))

    def running_components(self) -> list[str]:
        return [name for name in self.components if self.main_pid(name)]

    def spawn(self, component: str) -> int:
        spec = self.components[component]
        if self.main_pid(component):
            return self.main_pid(component)  # type: ignore[return-value]
        if spec.kind == "patroni":
            storage.check_mounted(self, component)
        home = spec.labels.get("home") or str(Path(spec.labels.get("data_dir", ".")).parent)
        answer = self.supervisor.call(
            "spawn", name=spec.name, argv=spec.argv, env=spec.env, user=spec.user,
            log=str(self.log_file(component)),
            cwd=home if spec.kind == "patroni" else None,  # never on a mount: it would pin it
        )
        record = {"pid": answer["pid"], "pgid": answer["pgid"], "start_ticks": answer["start_ticks"],
                  "started_at": utcnow(), "argv": spec.argv}
        self.state.write_pid_record(component, record)
        return int(answer["pid"])

    def exited(self, component: str) -> int | None:
        """Exit code if the supervisor saw the component's main process exit, else None."""
        record = self.pid_record(component)
        if not record:
            return None
        try:
            children = self.supervisor.call("ps")["children"]
        except SupervisorError:
            return None
        child = children.get(str(record["pid"]))
        return None if child is None else child["returncode"]

    # -- health -----------------------------------------------------------------------------
    def check(self, component: str, timeout: float = 1.0) -> tuple[bool, str]:
        spec = self.components[component]
        if not self.main_pid(component):
            return False, "not running"
        try:
            response = httpx.request(spec.health.method, spec.health.url, timeout=timeout)
        except httpx.HTTPError as exc:
            return False, f"{spec.health.method} {spec.health.url}: {type(exc).__name__}"
        if response.status_code not in spec.health.expect:
            return False, f"{spec.health.method} {spec.health.url} -> HTTP {response.status_code}"
        if spec.health.body_contains and spec.health.body_contains not in response.text:
            return False, (f"{spec.health.method} {spec.health.url} answered without "
                           f"{spec.health.body_contains!r}: another server on the port?")
        if spec.kind == "patroni":
            try:
                data = response.json()
                return True, f"{data.get('role')} ({data.get('state')})"
            except ValueError:
                pass
        return True, "ok"

    def wait_healthy(self, components: list[str], timeout: float, reporter: Reporter | None = None) -> None:
        pending = list(components)
        deadline = time.monotonic() + timeout
        reasons: dict[str, str] = {}
        while pending:
            for name in list(pending):
                code = self.exited(name)
                if code is not None:
                    raise ComponentUnhealthy(name, f"process exited with code {code}",
                                             tail(self.log_file(name)))
                ok, reasons[name] = self.check(name)
                if ok:
                    pending.remove(name)
                    if reporter:
                        reporter(f"{name} healthy")
            if not pending:
                return
            if time.monotonic() > deadline:
                name = pending[0]
                raise ComponentUnhealthy(name, f"not healthy after {timeout:.0f} s ({reasons.get(name)})",
                                         tail(self.log_file(name)))
            time.sleep(0.1)

    # -- database (infra/local/database.py) -------------------------------------------------
    @property
    def db(self) -> LocalDatabase:
        return LocalDatabase(self)

    def db_writable(self, timeout: float = 2.0) -> bool:
        return self.db.writable(timeout)

    def wait_db_writable(self, timeout: float) -> float:
        return self.db.wait_writable(timeout)

    def tail(self, component: str, lines: int = 25) -> str:
        """The end of a component's log (for error messages)."""
        return tail(self.log_file(component), lines)

    def run_step(self, name: str, argv: list[str], timeout: float = 60.0,
                 env_extra: dict[str, str] | None = None) -> None:
        """Run one setup command; secrets go in ``env_extra`` (never argv: it is visible in
        `ps` and written to the step's log)."""
        log = self.log_file(name)
        with open(log, "ab") as out:
            out.write(f"\n--- {utcnow()} {' '.join(argv)}\n".encode())
            out.flush()
            env = {**os.environ, **(env_extra or {}), procs.MARKER_VAR: str(self.state_dir)}
            result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    timeout=timeout, cwd=self.state_dir, stdin=subprocess.DEVNULL,
                                    check=False)
        if result.returncode != 0:
            raise ComponentUnhealthy(name, f"`{' '.join(argv[2:4])}` exited with {result.returncode}",
                                     tail(log))

    # -- up ---------------------------------------------------------------------------------
    def is_running(self) -> bool:
        if not self.info:
            return False
        return self.supervisor.alive() or bool(self.running_components())

    def preflight(self, platform: str = "controlplane") -> list[str]:
        from infra.local.platform import local_platform

        problems = []
        try:
            missing = local_platform(platform).missing()
        except EnvError as exc:
            missing = str(exc)
        if missing:
            problems.append(missing)
        for binary in ("/usr/bin/etcd", "/usr/bin/patroni", "/usr/sbin/haproxy",
                       "/usr/bin/docker-registry", "/usr/bin/prometheus", str(PG_BIN / "postgres")):
            if not Path(binary).exists():
                problems.append(f"{binary} is missing (apt-get install patroni etcd-server haproxy "
                                "docker-registry prometheus postgresql-15)")
        return problems

    def up(self, reporter: Reporter | None = None, *, infra_only: bool = False,
           timeout: float = 60.0, platform: str = "controlplane") -> dict[str, Any]:
        """Start every component and wait until all are healthy; tear down on any failure.

        ``platform`` names the platform under test (platforms/registry.py): ``controlplane``
        (ours, the default) or e.g. ``prefect``; its local module (infra/local/platform.py)
        adds its components beside the shared ones."""
        from infra.local.platform import local_platform

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
        if self.info and bool(self.info.get("storage_faults")) != self.storage_faults:
            # the data directories are in other places with and without the storage layer
            was = "with" if self.info.get("storage_faults") else "without"
            problems.append(f"this environment was created {was} --storage-faults: start it "
                            "the same way, or `gameday env down --purge` it first")
        if problems:
            raise EnvError("cannot start the local environment:\n  " + "\n  ".join(problems))

        hooks = local_platform(platform)
        commands = set() if infra_only or not hooks.CONTROLPLANE else controlplane_commands()
        with_cp = CONTROLPLANE_COMMANDS <= commands
        with_agents = with_cp and "agent" in commands
        previous = self.info or {}
        secrets = Secrets(**previous["secrets"]) if previous.get("secrets") else Secrets()
        agents = self.topology if with_agents else ()
        self.agents = agents
        # the platform's own components join the shared ones
        ports = allocate_ports(port_names(self.topology) + hooks.port_names()
                               + storage.port_names(self.storage_faults)
                               + node_disk.port_names(self.storage_faults,
                                                      tuple(a.name for a in agents)),
                               previous.get("ports"), owner=str(self.state_dir))
        for stale in (self.state_dir / "run").glob("*.json"):
            stale.unlink()
        # kept across up/down so a stopped environment restarts on its own data
        db_root = Path(previous.get("db_root") or db_root_for(self.state_dir, self.name))
        self.components = build_components(self.state_dir, self.name, ports, secrets, agents,
                                           with_cp, db_root=db_root,
                                           storage_faults=self.storage_faults)
        platform_info = hooks.prepare(previous.get("platform_info") or {})
        self.components.update(hooks.build_components(self.state_dir, ports, platform_info))
        zones = self._zones_of(agents)
        self.info = {
            "name": self.name, "state_dir": str(self.state_dir), "db_root": str(db_root),
            "status": "starting", "storage_faults": self.storage_faults,
            "started_at": utcnow(), "ports": ports, "secrets": asdict(secrets),
            "agents": [a.as_dict() for a in agents],
            "controlplane": {"included": with_cp, "agents": with_agents,
                             "missing_commands": sorted(CONTROLPLANE_COMMANDS | {"agent"} - commands)},
            "endpoints": self._endpoints(ports, secrets, with_cp),
            "tokens": {"projects": secrets.project_tokens, "agent": secrets.agent_token,
                       "admin": secrets.admin_token},
            "platform": platform, "platform_info": platform_info,
            "zones": zones,
        }
        self.info["endpoints"].update(hooks.endpoints(ports))
        self._write_info()
        self.note("env_up", {"controlplane": with_cp, "agents": [a.name for a in agents]})
        try:
            self._start_supervisor()
            say("supervisor running")
            self._up_infra(say, timeout)
            if with_cp:
                self._up_controlplane(say, timeout, agents)
            hooks.up(self, say, timeout)
            standby = self.db.wait_sync_standby(storage.db_timeout(self, timeout))
            say(f"synchronous standby: {standby}")
            if not os.environ.get(OWNER_ENV):
                self.supervisor.call("detach")  # outlives `up`: stopped by `down`
        except BaseException:
            say("start failed: tearing down what was started")
            self._teardown()
            self.info["status"] = "failed"
            self._write_info()
            raise
        self.info["status"] = "up"
        self.info["up_seconds"] = round(time.monotonic() - started, 2)
        self._write_info()
        return self.status()

    def _zones_of(self, agents: tuple[AgentSpec, ...]) -> dict[str, dict[str, list[str]]]:
        """Label the API replicas and database members with their zone and return what
        env.json keeps under ``zones`` (only the components this environment runs)."""
        for name, zone in {**API_ZONES, **DB_ZONES}.items():
            if name in self.components:
                self.components[name].labels["zone"] = zone
        present = set(self.components)
        routes = {f"db-{n}" for n in present} | {f"agent-{a.name}" for a in agents}
        return {zone: {"api": [n for n in parts["api"] if n in present],
                       "database": [n for n in parts["database"] if n in present],
                       "agents": [n for n in parts["agents"] if n in present],
                       "routes": [r for r in parts["routes"] if r in routes]}
                for zone, parts in zone_map(agents).items()}

    def zones(self) -> dict[str, dict[str, list[str]]]:
        """Per zone: its API replicas, database members, agents and fault-proxy routes, as
        `up` recorded them in env.json. An environment started before zones were recorded has
        none: that is an error naming the file, never a guess."""
        zones = self.info.get("zones")
        if not isinstance(zones, dict) or not zones:
            raise EnvError(f"{self.env_file}: no 'zones' field (this environment was started "
                           "before zones were recorded); run `gameday env down` and "
                           "`gameday env up` to record them")
        return zones

    def zone_of(self, component: str) -> str | None:
        """The zone of an API replica, database member or agent; None for regional services
        (and for every component of an environment started before zones were recorded)."""
        for zone, parts in (self.info.get("zones") or {}).items():
            if any(component in parts.get(k, []) for k in ("api", "database", "agents")):
                return zone
        return None

    def _endpoints(self, ports: dict[str, int], secrets: Secrets, with_cp: bool) -> dict[str, Any]:
        registry = f"127.0.0.1:{ports['proxy_registry']}"
        endpoints: dict[str, Any] = {
            "api": f"http://127.0.0.1:{ports['haproxy_api']}",
            "api_replicas": {f"api-{i}": f"http://127.0.0.1:{ports[f'api{i}']}" for i in (1, 2)},
            "dsn": app_dsn(ports, self.state_dir),
            "admin_dsn": superuser_dsn(ports["haproxy_pg"], secrets),
            "s3": f"http://127.0.0.1:{ports['proxy_s3']}",
            "s3_direct": f"http://127.0.0.1:{ports['moto']}",
            "bucket": BUCKET,
            "registry": registry,
            "registry_direct": f"127.0.0.1:{ports['registry']}",
            "image": f"{registry}/{IMAGE_REPOSITORY}:{IMAGE_TAG}",
            "prometheus": f"http://127.0.0.1:{ports['prometheus']}",
            "haproxy_stats": f"http://127.0.0.1:{ports['haproxy_stats']}/stats",
            "haproxy_socket": str(self.state_dir / "run" / "haproxy.sock"),
            "etcd": f"http://127.0.0.1:{ports['etcd_client']}",
            "patroni": {f"pg-{i}": f"http://127.0.0.1:{ports[f'pg{i}_rest']}" for i in (0, 1)},
            "fault_proxy": f"http://127.0.0.1:{ports['proxy_control']}",
            "fault_timeline": str(self.timeline_file),
            # `gameday run` lists its fault timeline endpoint here for this Prometheus
            "fault_metrics_targets": str(gameday_targets_file(self.state_dir)),
        }
        if not with_cp:
            endpoints.pop("api_replicas")
        return endpoints

    def _start_supervisor(self) -> None:
        log = self.log_file("supervisor")
        log.parent.mkdir(parents=True, exist_ok=True)
        ready = self.state_dir / "run" / "supervisor.ready"
        ready.unlink(missing_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "infra.local.supervisor", "--state", str(self.state_dir),
                 "--owner-pid", os.environ.get(OWNER_ENV) or str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=self.state_dir,
                env={**os.environ, procs.MARKER_VAR: str(self.state_dir)},
            )
        info = procs.read_stat(proc.pid)
        self.state.write_pid_record("supervisor", (
            {"pid": proc.pid, "pgid": proc.pid, "start_ticks": info.start_ticks if info else None,
             "started_at": utcnow()}))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ComponentUnhealthy("supervisor", f"exited with {proc.returncode}", tail(log))
            if ready.exists() and self.supervisor.alive():
                # The launcher must not keep a zombie of its own: reap it later if it exits.
                self._supervisor_proc = proc
                return
            time.sleep(0.02)
        raise ComponentUnhealthy("supervisor", "socket not ready after 10 s", tail(log))

    def _up_infra(self, say: Reporter, timeout: float) -> None:
        for group in (Group.INFRA, Group.DATABASE):
            for name, spec in self.components.items():
                if spec.group is group:
                    self.spawn(name)
            if group is Group.INFRA and storage.disks(self):
                # the members' data directories are on these mounts
                self.wait_healthy(storage.disks(self), timeout, say)
        say("infrastructure processes started")
        infra = [n for n, s in self.components.items() if s.group is Group.INFRA]
        self.wait_healthy(infra, timeout, say)
        with ThreadPoolExecutor(2) as pool:
            bucket = pool.submit(self._create_bucket)
            image = pool.submit(self._push_image)
            bucket.result()
            say(f"bucket {BUCKET} created")
            digest = image.result()
            say(f"image pushed ({digest[:19]})")
        self.info["endpoints"]["image_digest"] = digest
        self.wait_healthy(["pg-0", "pg-1"], storage.db_timeout(self, timeout), say)
        self.wait_db_writable(storage.db_timeout(self, timeout))
        say(f"database primary: {self.db.leader()}")
        self.db.setup_app_database()

    def _create_bucket(self) -> None:
        url = f"{self.endpoints['s3']}/{BUCKET}"
        response = httpx.put(url, timeout=5.0)
        if response.status_code not in (200, 409):
            raise ComponentUnhealthy("moto", f"PUT {url} -> HTTP {response.status_code}",
                                     response.text[-500:])

    def _push_image(self) -> str:
        from controlplane.registry import push_minimal_image

        try:
            return push_minimal_image(self.endpoints["registry"], IMAGE_REPOSITORY, IMAGE_TAG,
                                      labels={"org.opencontainers.image.title": "gameday sample workload"})
        except httpx.HTTPError as exc:
            raise ComponentUnhealthy("registry", f"pushing the sample image failed: {exc}",
                                     tail(self.log_file("registry"))) from exc

    def _up_controlplane(self, say: Reporter, timeout: float, agents: tuple[AgentSpec, ...]) -> None:
        from controlplane.db import DSN_ENV
        from infra.local.spec import gameday_argv

        dsn_env = {DSN_ENV: self.endpoints["dsn"]}
        self.run_step("migrate", gameday_argv("controlplane", "migrate"), env_extra=dsn_env)
        say("schema migrated")
        secrets = self.db.secrets()
        seed = {
            "projects": [{"name": p, "token": t} for p, t in secrets.project_tokens.items()],
            "agent_tokens": [secrets.agent_token],
            "admin_tokens": [secrets.admin_token],
            "queues": [dict(q) for q in DEFAULT_QUEUES],
        }
        import yaml

        seed_file = self.state_dir / "seed.yaml"
        seed_file.write_text(yaml.safe_dump(seed, sort_keys=False))
        os.chmod(seed_file, 0o600)
        self.run_step("seed", gameday_argv("controlplane", "seed", "--file", str(seed_file)),
                       env_extra=dsn_env)
        say("projects, tokens and queues seeded")
        names = [n for n, s in self.components.items() if s.group in (Group.CONTROLPLANE, Group.AGENT)]
        for name in names:
            self.spawn(name)
        say(f"control plane started ({len(names)} processes)")
        self.wait_healthy(names, timeout, say)

    # -- down -------------------------------------------------------------------------------
    def _teardown(self, grace: float = 3.0) -> list[int]:
        """Stop every process of this environment; return pids that survived (should be none)."""
        storage.stop_members_then_disks(self)  # no-op without the storage layer
        try:
            self.supervisor.call("shutdown", grace=grace)
        except SupervisorError:
            pass
        # Belt and braces: anything recorded or carrying our marker is killed by process group.
        leftovers: list[int] = []
        for name in [*self.components, "supervisor"]:
            record = self.pid_record(name)
            if record and procs.is_alive(record["pid"], record.get("start_ticks")):
                procs.signal_group(record["pgid"], signal.SIGKILL)
                leftovers.append(record["pid"])
        marked = procs.marked_processes(self.state_dir)
        for pid in marked:
            procs.signal_pids([pid], signal.SIGKILL)
        left = procs.wait_gone(leftovers + marked, 5.0)
        supervisor_proc = getattr(self, "_supervisor_proc", None)
        if supervisor_proc is not None:
            supervisor_proc.wait(timeout=5)
        for pid_file in (self.state_dir / "run").glob("*.json"):
            pid_file.unlink()
        return left

    def down(self, purge: bool = False) -> dict[str, Any]:
        """Stop everything (restoring every active fault first); keep state unless ``purge``."""
        started = time.monotonic()
        if not self.info and not self.state_dir.exists():
            raise NotRunning(f"environment {self.name!r} has no state at {self.state_dir}")
        if self.info:
            self.faults.close_all(reason="down")
        left = self._teardown()
        left += procs.marked_processes(self.state_dir)
        if left:
            raise EnvError(f"processes survived teardown: {sorted(set(left))}")
        seconds = round(time.monotonic() - started, 2)
        if self.info:
            self.note("env_down", {"seconds": seconds, "purge": purge})
            self.info["status"] = "down"
            self.info["down_seconds"] = seconds
            self._write_info()
        if purge:
            db_root = Path(self.info.get("db_root") or self.state_dir)
            for root in {db_root, self.state_dir}:  # never delete through a mount
                storage.detach_stale_mounts(root)
            if db_root != self.state_dir:
                shutil.rmtree(db_root, ignore_errors=True)
            shutil.rmtree(self.state_dir)
        return {"name": self.name, "down_seconds": seconds, "purged": purge}

    # -- configuration changes --------------------------------------------------------------
    def restart(self, components: list[str], timeout: float = 60.0, grace: float = 10.0) -> None:
        """Stop (SIGTERM, SIGKILL after ``grace``) and start components as `up` did, in
        parallel. A configuration change, not a fault: nothing goes on the fault timeline."""
        pids = {name: self.component_pids(name) for name in components}
        for name in components:
            record = self.pid_record(name)
            if record and self.main_pid(name):
                procs.signal_group(record["pgid"], signal.SIGTERM)
        left = procs.wait_gone([p for ps in pids.values() for p in ps], grace)
        if left:
            procs.signal_pids(left, signal.SIGKILL)
            procs.wait_gone(left, 5.0)
        for name in components:
            procs.wait_reaped(pids[name], 3.0)
            self.spawn(name)
        self.wait_healthy(components, timeout)

    def set_defects(self, names: list[str] | tuple[str, ...]) -> list[str]:
        """Restart every control-plane process (API replicas, reconciler, agents) with the
        seeded defects ``names`` switched on (controlplane/defects.py; test only), or with none.
        Returns the restarted components."""
        from controlplane import defects

        wanted = defects.parse(",".join(names))
        changed = []
        for name, spec in self.components.items():
            if spec.group not in (Group.CONTROLPLANE, Group.AGENT):
                continue
            env = {k: v for k, v in spec.env.items() if k != defects.ENV}
            mine = sorted(d for d in wanted if spec.kind in defects.WHERE[d])
            if mine:
                env[defects.ENV] = ",".join(mine)
            if env != spec.env:
                self.components[name] = dataclasses.replace(spec, env=env)
                changed.append(name)
        self.info["defects"] = sorted(wanted)
        self._write_info()
        if changed:
            self.note("defects", {"defects": sorted(wanted), "restarted": changed})
            self.restart(changed)
        return changed

    # -- releases (rolling upgrades, docs/upgrades.md) -------------------------------------
    def release_order(self) -> list[str]:
        """The control-plane processes in the order a rolling upgrade takes them: API
        replicas, then the reconciler, then the agents."""
        rank = {"api": 0, "reconciler": 1, "agent": 2}
        names = [n for n, s in self.components.items() if s.kind in rank]
        return sorted(names, key=lambda n: (rank[self.components[n].kind], names.index(n)))

    def release_of(self, component: str) -> str:
        from controlplane import release

        return release.parse(self.components[component].env.get(release.ENV))

    def schema_release(self) -> str:
        return str(self.info.get("schema_release", "N"))

    def migrate_schema(self, to: str, *, allow_downgrade: bool = False) -> None:
        """Run `gameday controlplane migrate --release TO` against the environment's database,
        as a deploy job would: with the seeded defects that live in the schema step on
        (controlplane/defects.py WHERE "migrate"; test only)."""
        from controlplane import defects
        from controlplane.db import DSN_ENV
        from infra.local.spec import gameday_argv

        extra = {DSN_ENV: self.endpoints["dsn"]}
        mine = sorted(d for d in self.info.get("defects", []) if "migrate" in defects.WHERE[d])
        if mine:
            extra[defects.ENV] = ",".join(mine)
        argv = gameday_argv("controlplane", "migrate", "--release", to)
        self.run_step("migrate", argv + (["--allow-downgrade"] if allow_downgrade else []),
                       env_extra=extra)
        self.info["schema_release"] = to
        self._write_info()

    def set_release(self, component: str, to: str, *, wait: bool = True,
                    timeout: float = 60.0) -> bool:
        """Restart one control-plane process as release ``to`` (SIGTERM, drain, start, wait
        healthy). False when it already runs that release (nothing restarted)."""
        from controlplane import release

        spec = self.components[component]
        env = {k: v for k, v in spec.env.items() if k != release.ENV}
        if release.parse(to) != release.DEFAULT:
            env[release.ENV] = to
        if env == spec.env:
            return False
        self.components[component] = dataclasses.replace(spec, env=env)
        self._write_info()
        if wait:
            self.restart([component], timeout)
        return True

    def reset_release(self, timeout: float = 60.0) -> list[str]:
        """Everything back to the default release: processes first (without waiting, so a
        broken schema cannot wedge the restore), then the schema, then wait for all."""
        from controlplane import release

        changed = [n for n in self.release_order()
                   if self.set_release(n, release.DEFAULT, wait=False)]
        if changed:
            pids = {n: self.component_pids(n) for n in changed}
            for name in changed:
                record = self.pid_record(name)
                if record and self.main_pid(name):
                    procs.signal_group(record["pgid"], signal.SIGTERM)
            left = procs.wait_gone([p for ps in pids.values() for p in ps], 10.0)
            procs.signal_pids(left, signal.SIGKILL)
            procs.wait_gone(left, 5.0)
        if self.schema_release() != release.DEFAULT:
            self.migrate_schema(release.DEFAULT, allow_downgrade=True)
        for name in changed:
            procs.wait_reaped(self.component_pids(name), 3.0)
            self.spawn(name)
        self.wait_healthy(changed, timeout)
        if changed:
            self.note("release", {"release": release.DEFAULT, "restarted": changed})
        return changed

    # -- status -----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """env.json plus live health of each component (secrets left out)."""
        with ThreadPoolExecutor(8) as pool:
            checks = dict(zip(self.components, pool.map(self.check, self.components)))
        roles = self.db.roles() if self.components else {}
        components = {}
        for name, spec in self.components.items():
            ok, detail = checks[name]
            components[name] = {
                "kind": spec.kind, "pid": self.main_pid(name), "healthy": ok, "detail": detail,
                "ports": spec.ports, "health_url": spec.health.url, "log": str(self.log_file(name)),
            }
            if spec.kind == "patroni":
                components[name]["role"] = roles.get(name)
                components[name]["postmaster_pid"] = self.postmaster_pid(name)
        pids = procs.marked_processes(self.state_dir)
        info = {k: v for k, v in self.info.items() if k not in ("secrets", "components")}
        info.update(
            components=components,
            healthy=bool(components) and all(c["healthy"] for c in components.values()),
            db_leader=self.db.leader() if self.components else None,
            processes=len(pids), rss_mib=round(procs.rss_kib(pids) / 1024, 1),
            pss_mib=round(procs.pss_kib(pids) / 1024, 1),
            active_faults=self.faults.active() if self.info else {},
        )
        return info

    def note(self, what: str, details: dict[str, Any] | None = None) -> None:
        self.state.note(what, details)
