"""Fixtures of the cloud-driver tests: stubbed Kubernetes clients, moto for AWS. No network."""

from __future__ import annotations

from pathlib import Path

import pytest

from environments.cloud.driver import FaultState
from environments.cloud.kubernetes import KubernetesFaults, KubeTarget
from tests.chaos.fake_kube import FakeCluster


@pytest.fixture
def state(tmp_path: Path) -> FaultState:
    return FaultState(tmp_path / "state" / "cloud-faults.json")


@pytest.fixture
def kube(fake_cluster: FakeCluster, state: FaultState) -> KubernetesFaults:
    return KubernetesFaults(KubeTarget(agent_name_prefix="mlplatform-dev",
                                       registry_cidrs=("10.10.50.11/32", "10.10.51.12/32"),
                                       drain_timeout=5), state)


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(var, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
