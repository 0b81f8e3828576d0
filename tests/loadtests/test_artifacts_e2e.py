"""ArtifactReader against a real control plane and a real S3 API server (moto): it finds a
succeeded operation, downloads its artifact path-style and verifies the checksum."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from environments.local.launch import ControlPlane, gameday_cmd
from environments.local.pgserver import free_port
from tests.controlplane.helpers import Api, claim_one, spec


@pytest.fixture
def s3_endpoint(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    with open(tmp_path / "moto.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(url, timeout=1.0)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _succeeded_operation_with_artifact(cp: ControlPlane, s3: str, body: bytes) -> str:
    user, agent = Api(cp.api_url, cp.user_token), Api(cp.api_url, cp.agent_token)
    op_id = user.submit(spec("artifact-source")).json()["id"]
    claim = claim_one(agent, agent.register("load-test-agent"))
    prefix = f"artifacts/{op_id}/attempt-{claim['number']}/"
    s3c = boto3.client("s3", endpoint_url=s3, region_name="us-east-1",
                       aws_access_key_id="x", aws_secret_access_key="x")
    s3c.create_bucket(Bucket="ml-artifacts")
    # plain unsigned GETs (no boto3 in the Locust process) need an object anonymous users may read
    s3c.put_object(Bucket="ml-artifacts", Key=prefix + "model.npy", Body=body, ACL="public-read")
    result = {"bucket": "ml-artifacts", "artifacts_prefix": prefix,
              "files": {"model.npy": {"sha256": hashlib.sha256(body).hexdigest()}}}
    for state in ("running", "succeeded"):
        r = agent.report(claim, state, reason="test", result=result if state == "succeeded" else None)
        assert r.status_code == 200, r.text
    return op_id


def test_artifact_reader_downloads_and_verifies(cp_stack: ControlPlane, s3_endpoint: str,
                                                tmp_path: Path, write_scenario: Any) -> None:
    op_id = _succeeded_operation_with_artifact(cp_stack, s3_endpoint, b"weights" * 100)
    path = write_scenario("artifacts", duration="3s",
                          users={"artifact_reader": {"count": 1, "wait_s": [0.2, 0.3]}},
                          thresholds={"max_error_rate": 0.0})
    out = tmp_path / "run"
    res = subprocess.run(gameday_cmd("load", "run", "--scenario", str(path), "--host", cp_stack.api_url,
                                     "--token", cp_stack.user_token, "--out", str(out),
                                     "--s3-endpoint", s3_endpoint),
                         check=False, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    stats = json.loads((out / "load_stats.json").read_text())
    s3 = next(r for r in stats["routes"] if r["route"].startswith("s3:"))
    assert s3["count"] >= 2 and s3["failures"] == 0  # checksum matched every time
    lines = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert {(r["route"], r["status"]) for r in lines if r["route"].startswith("s3:")} == {
        ("s3:/{bucket}/artifacts/{id}/attempt-{n}/{file}", 200)}
    assert op_id not in (out / "requests.jsonl").read_text()  # routes are templates, never ids
