"""The local environment's processes: the supervisor daemon (environments/local/supervisor.py) that
spawns every component, the pid records, health checks, setup steps, restarts and teardown.

``Processes`` owns the ``run/`` pid records and the supervisor; it reads the component specs
from the environment's record (environments/local/state.py) and knows nothing of what a component is
for, except that a Patroni member's postgres runs outside its process tree and that a member on
the storage layer starts only on its mounted disk (environments/local/storage.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from environments.local import procs, storage
from environments.local.errors import ComponentUnhealthy
from environments.local.state import EnvState, tail
from environments.local.supervisor import SupervisorClient, SupervisorError
from environments.timeline import utcnow

Reporter = Callable[[str], None]
# A process that owns every environment started under it for its whole life (a test session):
# when it dies, the supervisor kills everything, even if that process is killed hard.
OWNER_ENV = "GAMEDAY_OWNER_PID"


class Processes:
    def __init__(self, state: EnvState) -> None:
        self.state = state
        self._supervisor_proc: subprocess.Popen[bytes] | None = None

    @property
    def supervisor(self) -> SupervisorClient:
        return SupervisorClient(self.state.dir)

    # -- process records --------------------------------------------------------------------
    def main_pid(self, component: str) -> int | None:
        record = self.state.pid_record(component)
        if record and procs.is_alive(record["pid"], record.get("start_ticks")):
            return int(record["pid"])
        return None

    def postmaster_pid(self, component: str) -> int | None:
        """The postmaster of a Patroni member (it runs outside Patroni's process tree)."""
        spec = self.state.components[component]
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
        if self.state.components[component].kind == "patroni":
            postmaster = self.postmaster_pid(component)
            if postmaster:
                pids += [postmaster, *procs.descendants(postmaster)]
        return sorted(set(pids))

    def running_components(self) -> list[str]:
        return [name for name in self.state.components if self.main_pid(name)]

    def spawn(self, component: str) -> int:
        spec = self.state.components[component]
        if self.main_pid(component):
            return self.main_pid(component)  # type: ignore[return-value]
        if spec.kind == "patroni":
            storage.check_mounted(self.state.components, component)
        home = spec.labels.get("home") or str(Path(spec.labels.get("data_dir", ".")).parent)
        answer = self.supervisor.call(
            "spawn", name=spec.name, argv=spec.argv, env=spec.env, user=spec.user,
            log=str(self.state.log_file(component)),
            cwd=home if spec.kind == "patroni" else None,  # never on a mount: it would pin it
        )
        record = {"pid": answer["pid"], "pgid": answer["pgid"], "start_ticks": answer["start_ticks"],
                  "started_at": utcnow(), "argv": spec.argv}
        self.state.write_pid_record(component, record)
        return int(answer["pid"])

    def exited(self, component: str) -> int | None:
        """Exit code if the supervisor saw the component's main process exit, else None."""
        record = self.state.pid_record(component)
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
        spec = self.state.components[component]
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
                                             self.state.tail(name))
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
                                         self.state.tail(name))
            time.sleep(0.1)

    def run_step(self, name: str, argv: list[str], timeout: float = 60.0,
                 env_extra: dict[str, str] | None = None) -> None:
        """Run one setup command; secrets go in ``env_extra`` (never argv: it is visible in
        `ps` and written to the step's log)."""
        log = self.state.log_file(name)
        with open(log, "ab") as out:
            out.write(f"\n--- {utcnow()} {' '.join(argv)}\n".encode())
            out.flush()
            env = {**os.environ, **(env_extra or {}), procs.MARKER_VAR: str(self.state.dir)}
            result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    timeout=timeout, cwd=self.state.dir, stdin=subprocess.DEVNULL,
                                    check=False)
        if result.returncode != 0:
            raise ComponentUnhealthy(name, f"`{' '.join(argv[2:4])}` exited with {result.returncode}",
                                     tail(log))

    # -- stopping and starting again ---------------------------------------------------------
    def stop_groups(self, names: list[str], grace: float) -> None:
        """SIGTERM the process groups of ``names``, SIGKILL what is left after ``grace``."""
        pids = [p for n in names for p in self.component_pids(n)]
        pgids = [record["pgid"] for n in names
                 if (record := self.state.pid_record(n)) and self.main_pid(n)]
        procs.stop_groups(pgids, pids, grace)

    def terminate(self, components: list[str], grace: float) -> dict[str, list[int]]:
        """SIGTERM each component's group, SIGKILL every process still there after ``grace``;
        returns the pids each had (to wait until the supervisor reaped them)."""
        pids = {name: self.component_pids(name) for name in components}
        for name in components:
            record = self.state.pid_record(name)
            if record and self.main_pid(name):
                procs.signal_group(record["pgid"], signal.SIGTERM)
        left = procs.wait_gone([p for ps in pids.values() for p in ps], grace)
        if left:
            procs.signal_pids(left, signal.SIGKILL)
            procs.wait_gone(left, 5.0)
        return pids

    def restart(self, components: list[str], timeout: float = 60.0, grace: float = 10.0) -> None:
        """Stop (SIGTERM, SIGKILL after ``grace``) and start components as `up` did, in
        parallel. A configuration change, not a fault: nothing goes on the fault timeline."""
        pids = self.terminate(components, grace)
        for name in components:
            procs.wait_reaped(pids[name], 3.0)
            self.spawn(name)
        self.wait_healthy(components, timeout)

    # -- the supervisor ---------------------------------------------------------------------
    def start_supervisor(self) -> None:
        log = self.state.log_file("supervisor")
        log.parent.mkdir(parents=True, exist_ok=True)
        ready = self.state.dir / "run" / "supervisor.ready"
        ready.unlink(missing_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "environments.local.supervisor", "--state", str(self.state.dir),
                 "--owner-pid", os.environ.get(OWNER_ENV) or str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=self.state.dir,
                env={**os.environ, procs.MARKER_VAR: str(self.state.dir)},
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

    def teardown(self, grace: float = 3.0, leader: str | None = None) -> list[int]:
        """Stop every process of this environment; return pids that survived (should be none).
        ``leader`` (the Patroni leader, if known) stops after the replicas."""
        # no-op without the storage layer
        storage.stop_members_then_disks(self.state.components, self.stop_groups, leader)
        try:
            self.supervisor.call("shutdown", grace=grace)
        except SupervisorError:
            pass
        # Belt and braces: anything recorded or carrying our marker is killed by process group.
        leftovers: list[int] = []
        for name in [*self.state.components, "supervisor"]:
            record = self.state.pid_record(name)
            if record and procs.is_alive(record["pid"], record.get("start_ticks")):
                procs.signal_group(record["pgid"], signal.SIGKILL)
                leftovers.append(record["pid"])
        marked = procs.marked_processes(self.state.dir)
        for pid in marked:
            procs.signal_pids([pid], signal.SIGKILL)
        left = procs.wait_gone(leftovers + marked, 5.0)
        if self._supervisor_proc is not None:
            self._supervisor_proc.wait(timeout=5)
        for pid_file in (self.state.dir / "run").glob("*.json"):
            pid_file.unlink()
        return left
