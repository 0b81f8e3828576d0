"""Kubernetes runtime, offline: Job manifests checked against the Kubernetes OpenAPI schema
(kubernetes-validate), pod -> verdict mapping and the watch/log handling fed with recorded
(API-shaped) pod objects through stubbed API calls. No cluster runs here."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from controlplane.runtimes.base import InvalidWorkload, LaunchSpec, Outcome
from controlplane.runtimes.kubernetes import (
    GPU_RESOURCE,
    KubernetesRuntime,
    PodPhase,
    build_job,
    classify_job,
    classify_pod,
    pod_from_json,
    pool_options,
)

K8S_VERSION = "1.33.0"  # a current EKS version; the schema bundle of kubernetes-validate has it
RECORDED = json.loads((Path(__file__).parent / "recorded" / "pods.json").read_text())["pods"]
DIGEST = "sha256:" + "a" * 64


def spec(**overrides: Any) -> LaunchSpec:
    values: dict[str, Any] = {
        "operation_id": "0b6f6a4e-3c1d-4b7e-9d2a-6f5e4d3c2b1a",
        "attempt_id": "7c9e6679-7425-40de-944b-e07fc1f90ae7", "attempt_number": 2,
        "project": "ml-team", "kind": "train",
        "image": f"123456789012.dkr.ecr.eu-west-1.amazonaws.com/ml/trainer@{DIGEST}",
        "params": {"steps": 200, "checkpoint_every": 20, "seed": 7}, "cpu": 2,
        "bucket": "ml-artifacts", "timeout_seconds": 3600,
    }
    values.update(overrides)
    return LaunchSpec(**values)


@pytest.mark.parametrize("pool,accelerators", [("cpu", 0), ("gpu", 1), ("gpu", 4)])
def test_job_manifest_is_valid_against_the_kubernetes_schema(pool: str, accelerators: int) -> None:
    job = build_job(spec(accelerator_type="sim-a100" if accelerators else None,
                         accelerator_count=accelerators), pool_options(pool))
    # strict: unknown fields are errors too (a typo would otherwise be silently dropped)
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_schema_validation_rejects_a_broken_manifest() -> None:
    """The check above bites: a misspelt field fails strict validation."""
    job = build_job(spec(), pool_options("cpu"))
    job["spec"]["backoffLimits"] = job["spec"].pop("backoffLimit")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_job_manifest_carries_ids_placement_gpu_and_security() -> None:
    s = spec(accelerator_type="sim-a100", accelerator_count=2)
    job = build_job(s, pool_options("gpu", service_account="trainer"))
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]

    assert job["spec"]["backoffLimit"] == 0  # retries belong to the control plane
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    assert pod["restartPolicy"] == "Never"
    for labels in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]):
        assert labels["gameday.io/operation-id"] == s.operation_id
        assert labels["gameday.io/attempt-id"] == s.attempt_id
        assert labels["gameday.io/attempt-number"] == "2"
    assert pod["nodeSelector"] == {"platform.gameday/pool": "gpu"}  # infra POOL_LABEL
    assert {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert container["resources"]["limits"][GPU_RESOURCE] == "2"
    assert container["resources"]["requests"]["cpu"] == "2"
    assert pod["serviceAccountName"] == "trainer"
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["image"].endswith(DIGEST)  # pinned by digest, not by tag
    assert container["args"][:6] == ["--kind", "train", "--operation-id", s.operation_id, "--attempt", "2"]
    assert len(job["metadata"]["name"]) <= 63


def test_cpu_job_has_no_gpu_request() -> None:
    job = build_job(spec(), pool_options("cpu"))
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert GPU_RESOURCE not in resources["limits"] and GPU_RESOURCE not in resources["requests"]


def test_unknown_workload_params_fail_before_any_manifest() -> None:
    with pytest.raises(InvalidWorkload, match="unknown keys"):
        build_job(spec(params={"stpes": 3}), pool_options("cpu"))


@pytest.mark.parametrize("name,phase,reason_part,transient", [
    ("unschedulable", PodPhase.PENDING, "Unschedulable: 0/3 nodes are available", True),
    ("container_creating", PodPhase.PENDING, "ContainerCreating", True),
    ("image_pull_backoff", PodPhase.FAILED, "ImagePullBackOff", True),
    ("err_image_pull", PodPhase.FAILED, "ErrImagePull", True),
    ("invalid_image_name", PodPhase.FAILED, "InvalidImageName", False),
    ("config_error", PodPhase.FAILED, "secret \"s3-credentials\" not found", False),
    ("running", PodPhase.RUNNING, None, True),
    ("oom_killed", PodPhase.FAILED, "oom_killed", False),
    ("evicted", PodPhase.FAILED, "evicted: The node was low on resource: memory", True),
    ("spot_interrupted", PodPhase.FAILED, "evicted", True),
    ("error_exit", PodPhase.FAILED, "workload exited 1", True),
    ("invalid_input_exit", PodPhase.FAILED, "workload exited 2", False),
    ("succeeded", PodPhase.SUCCEEDED, "exited 0", True),
])
def test_recorded_pod_objects_map_to_pending_reasons_and_failures(
    name: str, phase: PodPhase, reason_part: str | None, transient: bool
) -> None:
    for pod in (pod_from_json(RECORDED[name]), RECORDED[name]):  # V1Pod model and raw watch dict
        verdict = classify_pod(pod)
        assert verdict.phase is phase, name
        if reason_part is None:
            assert verdict.reason is None
        else:
            assert verdict.reason and reason_part in verdict.reason
        if phase is PodPhase.FAILED:
            assert verdict.transient is transient


def test_job_deadline_exceeded_is_a_failure() -> None:
    job = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                                      "message": "Job was active longer than specified deadline"}]}}
    verdict = classify_job(job)
    assert verdict is not None and verdict.phase is PodPhase.FAILED
    assert "DeadlineExceeded" in (verdict.reason or "") and verdict.transient is False
    assert classify_job({"status": {"conditions": []}}) is None


class StubBatchApi:
    """Records the calls the runtime makes to ``BatchV1Api``."""

    def __init__(self) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []
        self.deleted: list[tuple[str, str, str]] = []

    def create_namespaced_job(self, namespace: str, body: dict[str, Any]) -> None:
        self.created.append((namespace, body))

    def delete_namespaced_job(self, name: str, namespace: str, propagation_policy: str) -> None:
        self.deleted.append((name, namespace, propagation_policy))


def _wait_result(handle: Any, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = handle.result()
        if result is not None:
            return result
        time.sleep(0.01)
    raise AssertionError("no result")


def test_stubbed_watch_pending_then_running_then_succeeded_streams_logs() -> None:
    batch = StubBatchApi()
    watched: list[tuple[str, str]] = []
    log_lines = ['@event {"kind": "progress", "message": "", "data": {"step": 5, "total": 10}}',
                 "plain stderr line",
                 '@event {"kind": "artifact_written", "message": "done", "data": {"prefix": "p/"}}']
    sequence = [("ADDED", "unschedulable"), ("MODIFIED", "container_creating"),
                ("MODIFIED", "running"), ("MODIFIED", "succeeded")]
    gate: list[int] = []

    def watch(namespace: str, selector: str) -> Any:
        watched.append((namespace, selector))
        for kind, name in sequence:
            while name != "unschedulable" and not gate:  # hold until the test saw the pending reason
                time.sleep(0.01)
            yield {"type": kind, "object": pod_from_json(RECORDED[name])}

    runtime = KubernetesRuntime(batch, core=None, options=pool_options("cpu"), watch_pods=watch,
                                stream_logs=lambda ns, pod: iter(log_lines))
    s = spec()
    handle = runtime.start(s)
    deadline = time.monotonic() + 5
    while "Unschedulable" not in (handle.pending_reason() or "") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "Insufficient nvidia.com/gpu" in (handle.pending_reason() or "")
    assert handle.result() is None
    gate.append(1)

    result = _wait_result(handle)
    assert result.outcome is Outcome.SUCCEEDED
    events = handle.drain_events()
    assert [e.kind for e in events] == ["progress", "log", "artifact_written"]
    assert batch.created[0][1]["metadata"]["labels"]["gameday.io/attempt-id"] == s.attempt_id
    assert watched == [("ml-workloads", f"gameday.io/attempt-id={s.attempt_id}")]
    handle.stop()
    assert batch.deleted == [(batch.created[0][1]["metadata"]["name"], "ml-workloads", "Background")]


@pytest.mark.parametrize("final,transient", [("oom_killed", False), ("evicted", True),
                                             ("image_pull_backoff", True)])
def test_stubbed_watch_maps_terminal_failures(final: str, transient: bool) -> None:
    def watch(namespace: str, selector: str) -> Any:
        yield {"type": "ADDED", "object": pod_from_json(RECORDED["container_creating"])}
        yield {"type": "MODIFIED", "object": pod_from_json(RECORDED[final])}

    runtime = KubernetesRuntime(StubBatchApi(), core=None, options=pool_options("cpu"),
                                watch_pods=watch, stream_logs=lambda ns, pod: iter(()))
    result = _wait_result(runtime.start(spec()))
    assert result.outcome is Outcome.FAILED and result.transient is transient


def test_stubbed_watch_pod_deleted_underneath_is_a_failure() -> None:
    def watch(namespace: str, selector: str) -> Any:
        yield {"type": "ADDED", "object": pod_from_json(RECORDED["running"])}
        yield {"type": "DELETED", "object": pod_from_json(RECORDED["running"])}

    runtime = KubernetesRuntime(StubBatchApi(), core=None, options=pool_options("cpu"),
                                watch_pods=watch, stream_logs=lambda ns, pod: iter(()))
    result = _wait_result(runtime.start(spec()))
    assert result.outcome is Outcome.FAILED and "deleted" in result.reason


def test_wait_returns_at_the_pods_final_phase_and_after_its_timeout_before() -> None:
    gate = threading.Event()

    def watch(namespace: str, selector: str) -> Any:
        yield {"type": "ADDED", "object": pod_from_json(RECORDED["running"])}
        gate.wait(30)
        yield {"type": "MODIFIED", "object": pod_from_json(RECORDED["succeeded"])}

    runtime = KubernetesRuntime(StubBatchApi(), core=None, options=pool_options("cpu"),
                                watch_pods=watch, stream_logs=lambda ns, pod: iter(()))
    handle = runtime.start(spec())
    handle.wait(0.05)  # still running: the timeout ends the wait
    assert handle.result() is None
    gate.set()
    t0 = time.monotonic()
    handle.wait(60)  # the runner's tick: the final phase ends it, not the 60 s
    assert time.monotonic() - t0 < 30 and handle.result() is not None
