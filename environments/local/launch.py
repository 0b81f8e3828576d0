"""Start control-plane processes as children (tests, benchmarks). The local environment has
its own supervisor; this is the minimal version: process groups, readiness wait, clean kill."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from environments.local import watchdog
from environments.local.pgserver import free_port


def gameday_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gameday.cli", *args]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    port: int | None = None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 5.0) -> None:
        self.kill(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.popen.wait(5)

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def spawn(name: str, args: list[str], logdir: Path, env: dict[str, str] | None = None,
          port: int | None = None) -> Proc:
    log = logdir / f"{name}.log"
    out = open(log, "ab")
    popen = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                             env={**os.environ, **(env or {})})
    out.close()
    watchdog.watch(popen.pid)  # dies with its owner, even a test session killed hard
    return Proc(name, popen, log, port)


def wait_http(url: str, proc: Proc, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}): {proc.tail()}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} not ready at {url} after {timeout}s: {proc.tail()}")


@dataclass
class ControlPlane:
    """API replicas + reconciler(s) on one database, seeded with one project and tokens."""

    dsn: str
    replicas: int = 1
    reconcilers: int = 1
    lease_seconds: float = 15.0
    agent_timeout: float | None = None
    retry_base: float = 1.0
    api_workers: int = 1
    # None: a temporary directory of its own, removed again when the `with` block ends
    # without an error (after an error it is kept: the processes' logs say what went wrong)
    logdir: Path = None  # type: ignore[assignment]
    project: str = "ml-team"
    user_token: str = field(default_factory=lambda: "u-" + secrets.token_hex(16))
    other_user_token: str = field(default_factory=lambda: "o-" + secrets.token_hex(16))
    agent_token: str = field(default_factory=lambda: "a-" + secrets.token_hex(16))
    admin_token: str = field(default_factory=lambda: "x-" + secrets.token_hex(16))
    queues: list[dict[str, object]] = field(
        default_factory=lambda: [{"name": "default", "priority": 0, "concurrency": 1000},
                                 {"name": "urgent", "priority": 10, "concurrency": 1000}])
    apis: list[Proc] = field(default_factory=list)
    recs: list[Proc] = field(default_factory=list)
    owns_logdir: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.logdir is None:
            self.logdir = Path(tempfile.mkdtemp(prefix="cp-"))
            self.owns_logdir = True

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.apis[0].port}"

    def start(self, migrate: bool = True) -> ControlPlane:
        env = {"CONTROLPLANE_DSN": self.dsn}
        if migrate:
            subprocess.run(gameday_cmd("controlplane", "migrate"), check=True, env={**os.environ, **env},
                           capture_output=True)
        seed = self.logdir / "seed.yaml"
        seed.write_text(yaml.safe_dump({
            "projects": [{"name": self.project, "token": self.user_token},
                         {"name": "other-team", "token": self.other_user_token}],
            "agent_tokens": [self.agent_token], "admin_tokens": [self.admin_token],
            "queues": self.queues}))
        subprocess.run(gameday_cmd("controlplane", "seed", "--file", str(seed)), check=True,
                       env={**os.environ, **env}, capture_output=True)
        for i in range(self.replicas):
            self.start_api(i)
        for i in range(self.reconcilers):
            self.start_reconciler(i)
        return self

    def start_api(self, i: int) -> Proc:
        port = free_port()
        p = spawn(f"api-{i}", gameday_cmd(
            "controlplane", "api", "--port", str(port), "--lease-seconds", str(self.lease_seconds),
            "--retry-base", str(self.retry_base), "--workers", str(self.api_workers)),
            self.logdir, {"CONTROLPLANE_DSN": self.dsn}, port)
        wait_http(f"http://127.0.0.1:{port}/readyz", p)
        if i < len(self.apis):
            self.apis[i] = p
        else:
            self.apis.append(p)
        return p

    def start_reconciler(self, i: int) -> Proc:
        port = free_port()
        p = spawn(f"reconciler-{i}", gameday_cmd(
            "controlplane", "reconciler", "--metrics-port", str(port), "--interval", "0.2",
            "--lease-seconds", str(self.lease_seconds),
            "--agent-timeout", str(self.agent_timeout or self.lease_seconds),
            "--retry-base", str(self.retry_base)), self.logdir, {"CONTROLPLANE_DSN": self.dsn}, port)
        wait_http(f"http://127.0.0.1:{port}/metrics", p)
        self.recs.append(p)
        return p

    def stop(self) -> None:
        for p in [*self.apis, *self.recs]:
            p.stop()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.stop()
        if self.owns_logdir and exc_type is None:
            shutil.rmtree(self.logdir, ignore_errors=True)
