"""Helpers for the agent tests: real servers (moto, docker-registry) in their own process groups.

Every process is started in its own process group on a random loopback port and killed
(group-wide, after a SIGCONT in case a test froze it) in teardown.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from controlplane import storage
from controlplane.registry import push_minimal_image
from environments.local import motoserver, procs, watchdog
from environments.local.pgserver import free_port

VENV_BIN = Path(sys.executable).parent
REPO_ROOT = Path(__file__).resolve().parents[2]
TRAINER_REPO = "ml/trainer"
TRAINER_TAG = "1.0"


@dataclass
class Proc:
    """A process in its own group, with the faults tests inject."""

    popen: subprocess.Popen[bytes]
    name: str

    @property
    def pid(self) -> int:
        return self.popen.pid

    def freeze(self) -> None:
        """SIGSTOP the group and wait until every thread of the process is stopped: the stop
        reaches a busy thread on another core a little later, and a request it answered in
        between made a frozen-registry test fail once in CI."""
        os.killpg(self.pid, signal.SIGSTOP)
        procs.wait_stopped([self.pid], 5.0)

    def thaw(self) -> None:
        os.killpg(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.popen.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.killpg(self.pid, sig)
                except ProcessLookupError:
                    break
        self.popen.wait(timeout=10)


class ProcessSupervisor:
    def __init__(self) -> None:
        self.procs: list[Proc] = []

    def start(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> Proc:
        log = open(log_path, "wb")
        popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True)
        log.close()
        # the group dies with the test session even when pytest itself is killed
        watchdog.watch(popen.pid)
        proc = Proc(popen, name)
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in reversed(self.procs):
            proc.kill()


def wait_http(url: str, timeout: float = 15.0, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode} before it was ready")
        try:
            httpx.get(url, timeout=1.0)
            return
        except httpx.HTTPError as exc:
            last = exc
            time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout}s: {last}")


@dataclass
class S3Server:
    proc: Proc
    endpoint: str
    bucket: str = storage.DEFAULT_BUCKET

    def store(self, deadline: float | None = None) -> storage.ObjectStore:
        return storage.ObjectStore.from_config(
            storage.StorageConfig(endpoint_url=self.endpoint, bucket=self.bucket),
            storage.RetryPolicy(initial_backoff=0.1, max_backoff=0.5, deadline_seconds=deadline))


def start_moto(sup: ProcessSupervisor, log_dir: Path) -> S3Server:
    port = free_port()
    proc = sup.start("moto_server", motoserver.command(port), log_dir / f"moto-{port}.log")
    server = S3Server(proc, f"http://127.0.0.1:{port}")
    wait_http(server.endpoint + "/moto-api/", proc=proc)
    server.store().ensure_bucket()
    return server


@dataclass
class Registry:
    proc: Proc
    host: str  # 127.0.0.1:PORT

    @property
    def trainer_image(self) -> str:
        return f"{self.host}/{TRAINER_REPO}:{TRAINER_TAG}"


def start_registry(sup: ProcessSupervisor, root: Path) -> Registry:
    binary = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    port = free_port()
    (root / "data").mkdir(parents=True, exist_ok=True)
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = sup.start("docker-registry", [binary, "serve", str(config)], root / "registry.log")
    registry = Registry(proc, f"127.0.0.1:{port}")
    wait_http(f"http://{registry.host}/v2/", proc=proc)
    push_minimal_image(registry.host, TRAINER_REPO, TRAINER_TAG, labels={"role": "sample-trainer"})
    # whoever answered must be this registry: a test freezing or killing it must reach the server
    # its requests go to (a CI run once had another registry on the port)
    if not (root / "data" / "docker" / "registry" / "v2" / "repositories" / TRAINER_REPO).is_dir():
        raise RuntimeError(f"the image pushed to {registry.host} is not in {root / 'data'}: "
                           f"another server answers on that port ({proc.name} log: {root})")
    return registry


def workload_argv(operation_id: str, attempt: int, s3: S3Server, *, steps: int, every: int,
                  seed: int = 7, step_delay: float = 0.0) -> list[str]:
    return [sys.executable, "-u", "-m", "controlplane.workload", "--operation-id", operation_id,
            "--attempt", str(attempt), "--steps", str(steps), "--checkpoint-every", str(every),
            "--seed", str(seed), "--step-delay", str(step_delay), "--s3-endpoint", s3.endpoint,
            "--bucket", s3.bucket]



@contextmanager
def gray_http_server(silent: int | None = None, answer_json: bytes = b"{}") -> Iterator[int]:
    """A loopback server that accepts connections, reads requests and keeps the first
    ``silent`` connections (all of them if None) silent: a gray network's connection that is
    accepted and never answered. Later connections get 200 with ``answer_json``."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()
    answer = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
              + str(len(answer_json)).encode() + b"\r\n\r\n" + answer_json)

    def serve(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(answer)

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn = server.accept()[0]
            except OSError:
                continue
            held.append(conn)
            if silent is not None and len(held) > silent:
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        for conn in held:
            conn.close()
        server.close()
