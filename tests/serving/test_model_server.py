"""One KServe model-server replica (controlplane/serving/server.py, in .venv-kserve) against a
real moto S3 server: ready only once its model is loaded with the deployed digest, the reason
when not, the version that answered on every response, and a bad artifact's behaviour."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest

from controlplane.serving.catalog import GOLDEN, GOLDEN_INPUTS, MODEL_NAME, publish
from environments.local import motoserver, serving
from environments.local.ports import reserve_port
from loadtests.runner import start as start_load
from loadtests.scenario import load_scenario
from slo import sli
from slo.inference_ledger import read as read_inference

BUCKET = "ml-artifacts"
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
         "AWS_DEFAULT_REGION": "us-east-1"}

pytestmark = pytest.mark.skipif(
    not serving.venv_python().exists(),
    reason=f"{serving.venv_python()} missing: KServe's venv is made by scripts/setup-kserve.sh")


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **env})


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = reserve_port()
    proc = _start(motoserver.command(port), tmp_path_factory.mktemp("moto") / "moto.log", CREDS)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{endpoint}/moto-api/", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    boto3.client("s3", endpoint_url=endpoint, **_keys()).create_bucket(Bucket=BUCKET)
    yield endpoint
    _stop(proc)


def _keys() -> dict[str, str]:
    return {"aws_access_key_id": "testing", "aws_secret_access_key": "testing",
            "region_name": "us-east-1"}


def _put(endpoint: str):
    client = boto3.client("s3", endpoint_url=endpoint, **_keys())
    return lambda key, data: client.put_object(Bucket=BUCKET, Key=key, Body=data)


class Replica:
    def __init__(self, tmp: Path, store: str, version: str, digest: str,
                 defects: str = "") -> None:
        self.port = reserve_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.status_file = tmp / "status.json"
        spec = serving.component(tmp, "model-1", self.port, store, version)
        argv = list(spec.argv)
        argv[argv.index("--sha256") + 1] = digest
        argv[argv.index("--status-file") + 1] = str(self.status_file)
        env = {**spec.env, "CONTROLPLANE_DEFECTS": defects} if defects else spec.env
        self.proc = _start(argv, tmp / "replica.log", env)

    def ready_code(self) -> int | None:
        try:
            return httpx.get(f"{self.url}{serving.ready_path()}", timeout=1).status_code
        except httpx.HTTPError:
            return None

    def answered_ready_code(self, timeout: float = 30.0) -> int:
        """The readiness answer once the server answers at all: its status file can say
        "unready" before its HTTP server listens (a refused connection, read as no answer, failed
        a loaded CI run)."""
        self.wait_for(lambda: self.ready_code() is not None, timeout)
        code = self.ready_code()
        assert code is not None, "the model server stopped answering"
        return code

    def wait_for(self, predicate, timeout: float = 60.0) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            assert self.proc.poll() is None, "the model server exited"
            if predicate():
                return time.monotonic() - started
            time.sleep(0.1)
        raise AssertionError(f"not within {timeout} s; status {self.status()}")

    def status(self) -> dict | None:  # type: ignore[type-arg]
        try:
            return json.loads(self.status_file.read_text())
        except (OSError, ValueError):
            return None

    def infer(self, rows: list[list[float]]) -> httpx.Response:
        body = {"inputs": [{"name": "x", "shape": [len(rows), 4], "datatype": "FP64",
                            "data": [v for row in rows for v in row]}]}
        return httpx.post(f"{self.url}/v2/models/{MODEL_NAME}/infer", json=body, timeout=5)


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for replica in started:
        _stop(replica.proc)


def test_ready_only_once_the_deployed_version_is_loaded(moto: str, tmp_path: Path,
                                                         replicas: list[Replica]) -> None:
    version = "v1"  # published by this test alone, after the replica started
    replica = Replica(tmp_path, moto, version, serving.digest_of(version))
    replicas.append(replica)
    # nothing published yet: up and answering, not ready, the reason says why
    replica.wait_for(lambda: (replica.status() or {}).get("state") == "unready")
    assert replica.answered_ready_code() == 503
    assert "NoSuchKey" in replica.status()["reason"]  # type: ignore[index]
    assert replica.infer([GOLDEN_INPUTS[0]]).status_code == 503
    publish(_put(moto), version)
    took = replica.wait_for(lambda: replica.ready_code() == 200, timeout=10)
    assert replica.status()["state"] == "ready", replica.status()  # type: ignore[index]
    answer = replica.infer([list(r) for r in GOLDEN.inputs])
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-model-version"] == version
    body = answer.json()
    assert body["model_version"] == version
    assert body["outputs"][0]["data"] == pytest.approx(list(GOLDEN.expected))
    assert took < 10


def test_a_digest_other_than_the_deployed_one_is_never_served(moto: str, tmp_path: Path,
                                                               replicas: list[Replica]) -> None:
    publish(_put(moto), "v2")
    replica = Replica(tmp_path, moto, "v2", "0" * 64)
    replicas.append(replica)
    replica.wait_for(lambda: "sha256" in str((replica.status() or {}).get("reason")))
    status = replica.status()
    assert status["state"] == "unready"  # type: ignore[index]
    assert f"is not the deployed {'0' * 64}" in status["reason"]  # type: ignore[index]
    time.sleep(1.5)  # several more load attempts: still refused
    assert replica.answered_ready_code() == 503
    assert replica.infer([GOLDEN_INPUTS[1]]).status_code == 503


# tier2: two replicas started (6 s quiet, 20 s on the loaded 2-core machine); make test is at
# its budget, and the healthy half is the readiness test's "NoSuchKey" above
@pytest.mark.tier2
def test_a_store_out_of_reach_keeps_it_unready_saying_why_unless_the_seeded_defect(
        tmp_path: Path, replicas: list[Replica]) -> None:
    """model-store-unavailable: a replica that cannot read its model never answers; with the
    seeded defect serve-partial-model it goes ready anyway and answers with weights it never
    read (the shape no-half-loaded-model catches)."""
    nowhere = f"http://127.0.0.1:{reserve_port()}"  # nothing listens: connection refused
    for d in ("healthy", "broken"):
        (tmp_path / d).mkdir()
    healthy = Replica(tmp_path / "healthy", nowhere, "v1", serving.digest_of("v1"))
    broken = Replica(tmp_path / "broken", nowhere, "v1", serving.digest_of("v1"),
                     defects="serve-partial-model")
    replicas += [healthy, broken]
    healthy.wait_for(lambda: (healthy.status() or {}).get("state") == "unready")
    assert healthy.status()["reason"].startswith("artifact store unreachable: ")  # type: ignore[index]
    assert healthy.answered_ready_code() == 503
    assert healthy.infer([GOLDEN_INPUTS[1]]).status_code == 503
    broken.wait_for(lambda: broken.ready_code() == 200)
    assert broken.status()["reason"].startswith("serving what was loaded: artifact store "  # type: ignore[index]
                                                "unreachable")
    answer = broken.infer([list(r) for r in GOLDEN.inputs])
    assert answer.status_code == 200 and answer.headers["x-model-version"] == "v1"
    assert answer.json()["outputs"][0]["data"] != pytest.approx(list(GOLDEN.expected))


def test_a_bad_artifact_misbehaves_as_its_behaviour_says(moto: str, tmp_path: Path,
                                                          replicas: list[Replica]) -> None:
    publish(_put(moto), "v2-errors")
    publish(_put(moto), "v2-slow")
    for sub in ("e", "s"):
        (tmp_path / sub).mkdir()
    errors = Replica(tmp_path / "e", moto, "v2-errors", serving.digest_of("v2-errors"))
    slow = Replica(tmp_path / "s", moto, "v2-slow", serving.digest_of("v2-slow"))
    replicas += [errors, slow]
    for replica in (errors, slow):
        replica.wait_for(lambda r=replica: r.ready_code() == 200)
    codes = [errors.infer([GOLDEN_INPUTS[0]]).status_code for _ in range(40)]
    assert 8 <= codes.count(500) <= 32, codes  # error_ratio 0.5 of 40, seeded
    assert set(codes) == {200, 500}
    # the counter the cluster's canary analysis divides (model_server_requests_total by code)
    metrics = httpx.get(f"{errors.url}/metrics", timeout=5).text
    for code in (200, 500):
        line = f'model_server_requests_total{{code="{code}",model_name="{MODEL_NAME}"}}'
        assert f"{line} {float(codes.count(code))}" in metrics, (line, metrics[-2000:])
    started = time.monotonic()
    answer = slow.infer([GOLDEN_INPUTS[0]])
    assert answer.status_code == 200 and answer.headers["x-model-version"] == "v2-slow"
    assert time.monotonic() - started >= 0.4


def _inference_run(replica: Replica, out: Path) -> list:  # type: ignore[type-arg]
    """Locust's Inferrer users alone against ``replica`` for a few seconds; the ledger."""
    scn = load_scenario("gameday")
    idle = {name: getattr(scn.users, name).model_copy(update={"count": 0})
            for name in ("submitter", "poller", "artifact_reader")}
    scn = scn.model_copy(update={"users": scn.users.model_copy(update=idle)})
    run = start_load(scn, "http://127.0.0.1:9", "unused", out, duration=4.0,
                     serving_endpoint=replica.url, serving_model=MODEL_NAME)
    run.wait()
    return read_inference(out / "inference.jsonl")


def test_the_inference_users_ledger_says_who_answered_and_whether_right(
        moto: str, tmp_path: Path, replicas: list[Replica]) -> None:
    for version in ("v1", "v2-garbage"):
        publish(_put(moto), version)
        (tmp_path / version).mkdir()
        replica = Replica(tmp_path / version, moto, version, serving.digest_of(version))
        replicas.append(replica)
        replica.wait_for(lambda r=replica: r.ready_code() == 200)
        records = _inference_run(replica, tmp_path / f"load-{version}")
        assert len(records) >= 10, records
        assert {r.version for r in records} == {version}
        assert sli.count(sli.serving_success(records)) == (len(records), len(records))
        good, total = sli.count(sli.serving_correctness(records))
        assert total == len(records)
        # v1 answers every golden row right; the garbage weights get each one wrong
        assert good == (total if version == "v1" else 0), version
