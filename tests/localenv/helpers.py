"""Helpers for the local-environment tests: an API client that behaves like a good user."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx

from environments.local.env import LocalEnvironment


def operation_spec(env: LocalEnvironment, steps: int = 5, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "localenv-test", "queue": "default", "priority": 0,
        "workload": {"kind": "train", "image": env.endpoints["image"],
                     "params": {"steps": steps, "checkpoint_every": max(1, steps // 2), "seed": 7}},
        "resources": {"cpu": 1, "accelerator": None},
        "placement": {"regions": None, "dataset": None},
        "max_retries": 2, "timeout_seconds": 300, "labels": {"test": "localenv"},
    }
    spec.update(overrides)
    return spec


class Client:
    """A well-behaved API client: retries transport errors and 5xx with the same Idempotency-Key."""

    def __init__(self, env: LocalEnvironment, project: str = "team-a", timeout: float = 3.0) -> None:
        self.base = env.endpoints["api"]
        self.token = env.tokens["projects"][project]
        self.http = httpx.Client(base_url=self.base, timeout=timeout,
                                 headers={"Authorization": f"Bearer {self.token}"})

    def submit(self, spec: dict[str, Any], key: str | None = None, deadline: float = 30.0) -> dict[str, Any]:
        key = key or str(uuid.uuid4())
        give_up = time.monotonic() + deadline
        last: str = ""
        while time.monotonic() < give_up:
            try:
                response = self.http.post("/v1/operations", json=spec, headers={"Idempotency-Key": key})
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code in (200, 201):
                    return response.json()
                if response.status_code < 500:
                    raise AssertionError(f"submission rejected: {response.status_code} {response.text}")
                last = f"HTTP {response.status_code}"
            time.sleep(0.1)
        raise AssertionError(f"submission {key} not acknowledged within {deadline} s: {last}")

    def get(self, operation_id: str) -> dict[str, Any]:
        for _ in range(50):
            try:
                response = self.http.get(f"/v1/operations/{operation_id}")
                if response.status_code < 500:
                    response.raise_for_status()
                    return response.json()
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"GET operation {operation_id} kept failing")

    def close(self) -> None:
        self.http.close()


def s3_client(endpoint: str, timeout: float = 2.0) -> Any:
    """boto3 S3 client with explicit timeouts and no retries (defaults hang for minutes)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
        config=Config(connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 1}),
    )
