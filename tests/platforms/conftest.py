"""Fixtures that start what each platform adapter needs, for real:

- ``controlplane``: the existing ``cp_stack`` (API replica + reconciler on a fresh database),
- ``prefect``: a Prefect 3 server (from ``.venv-prefect``) on its own database of the session's
  private PostgreSQL, one process worker for the ``cpu-pool``, the sample flow deployed,
- both: a moto S3 server holding the artifact bucket.

Every process started here is killed (by process group) in teardown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from environments.local import motoserver
from environments.local import prefect as pf
from environments.local.pgserver import PostgresServer, free_port

VENV_BIN = Path(sys.executable).parent


@dataclass
class Procs:
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        out = open(log, "ab")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env={**os.environ, **(env or {})}, start_new_session=True,
                             cwd=log.parent)
        out.close()
        self.procs.append(p)
        return p

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited {proc.returncode}:\n"
                               + log.read_text()[-3000:])
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout}s:\n" + log.read_text()[-3000:])


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logdir = tmp_path_factory.mktemp("moto")
    procs = Procs()
    port = free_port()
    log = logdir / "moto.log"
    p = procs.start(motoserver.command(port), log,
                    {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_http(endpoint + "/moto-api/", p, log, 30)
        httpx.put(f"{endpoint}/ml-artifacts", timeout=5).raise_for_status()
        yield endpoint
    finally:
        procs.stop_all()


@dataclass
class PrefectStack:
    api: str
    deployments: dict[str, str]
    s3: str
    server_start_s: float
    worker_start_s: float
    logdir: Path


@pytest.fixture(scope="session")
def prefect_stack(moto_s3: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectStack]:
    why = pf.missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)  # CI must run the Prefect suite for real
        pytest.skip(why)
    logdir = tmp_path_factory.mktemp("prefect")
    procs = Procs()
    pg = PostgresServer(fsync=False)
    pg.start()
    try:
        pg.create_database("prefect")
        port = free_port()
        dsn = f"postgresql+asyncpg://postgres@127.0.0.1:{pg.port}/prefect"
        server = pf.server_spec(logdir / "server-home", dsn, port)
        slog = logdir / "prefect-server.log"
        sp = procs.start(server.argv, slog, server.env)
        server_s = wait_http(server.health.url, sp, slog, 120)
        api = pf.api_url(port)
        worker = pf.WORKERS[0]
        hport = free_port()
        wspec = pf.worker_spec(logdir / "worker-home", api, worker, hport, moto_s3)
        wlog = logdir / f"{worker.name}.log"
        started = time.monotonic()
        wp = procs.start(wspec.argv, wlog, wspec.env)
        wait_http(wspec.health.url, wp, wlog, 60)
        pf.wait_pools(api, [worker.work_pool], 30)
        worker_s = time.monotonic() - started
        deployments = pf.deploy(api, moto_s3, pools=(worker.pool,))
        yield PrefectStack(api, deployments, moto_s3, server_s, worker_s, logdir)
    finally:
        procs.stop_all()
        pg.stop()
