"""A real moto server for tests/infra (subprocess on 127.0.0.1, stopped with its fixture and
tied to the test session like every server tests start)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import boto3
import httpx
import pytest

from environments.local import motoserver
from environments.local.launch import spawn, wait_http
from environments.local.pgserver import free_port


@contextmanager
def moto_server(log_dir: Path, extra_env: dict[str, str] | None = None) -> Iterator[str]:
    """Yield the endpoint URL of a fresh moto server."""
    port = free_port()
    proc = spawn("moto", motoserver.command(port), log_dir,
                 env={"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                      **(extra_env or {})})
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_http(endpoint + "/moto-api/", proc, 30)
        yield endpoint
    finally:
        proc.stop()


def fresh_session(endpoint: str, monkeypatch: pytest.MonkeyPatch, region: str,
                  endpoint_env: bool = True) -> boto3.session.Session:
    """Reset the moto server and return a boto3 session on it: test credentials, ``region``,
    no profile; ``AWS_ENDPOINT_URL`` set to it (``endpoint_env``) or unset (the code under
    test is then given the endpoint explicitly)."""
    httpx.post(f"{endpoint}/moto-api/reset", timeout=5).raise_for_status()
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": region}.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(key, raising=False)
    if endpoint_env:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    else:
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    return boto3.session.Session(region_name=region)
