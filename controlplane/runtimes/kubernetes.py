"""The ``kubernetes`` runtime: one ``batch/v1`` Job per attempt, watched through its pod.

* ``build_job`` is a pure function (spec + pool options -> manifest dict), validated in tests
  against the Kubernetes OpenAPI schema.
* ``classify_pod`` maps a pod's phase, conditions and container states to a verdict: still
  pending (with the reason a user should see), running, succeeded, or failed with a reason and
  whether a retry may help.
* ``KubernetesRunHandle`` consumes a pod watch and the pod's log stream on background threads.

``backoffLimit: 0`` and ``restartPolicy: Never``: retries belong to the control plane, which
counts them, applies backoff and keeps the original error.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from controlplane import workload_classes
from controlplane.runtimes.base import LaunchSpec, Outcome, RunResult, workload_args
from controlplane.workload.events import WorkloadEvent, parse_line

LABEL_PREFIX = "gameday.io"
GPU_RESOURCE = "nvidia.com/gpu"
# Karpenter's node label; the NodePools allow spot only where the pool is SPOT
# (provisioning/components/autoscaling.py), so the pod's own requirement decides.
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"


@dataclass(frozen=True)
class Toleration:
    key: str
    value: str | None = None
    effect: str = "NoSchedule"
    operator: str = "Equal"

    def to_manifest(self) -> dict[str, str]:
        out = {"key": self.key, "operator": self.operator, "effect": self.effect}
        if self.value is not None and self.operator == "Equal":
            out["value"] = self.value
        return out


@dataclass(frozen=True)
class JobOptions:
    """Per-pool placement and per-cluster security settings of workload Jobs."""

    namespace: str = "ml-workloads"
    service_account: str = "ml-workload"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Toleration] = ()
    memory_per_cpu: str = "1Gi"
    run_as_user: int = 10001
    ttl_seconds_after_finished: int = 3600
    image_pull_secrets: Sequence[str] = ()


# Same label as provisioning/components/common.py POOL_LABEL (the control plane does not import provisioning/).
POOL_LABEL = "platform.gameday/pool"


def pool_options(pool: str, namespace: str = "ml-workloads",
                 service_account: str = "ml-workload") -> JobOptions:
    """Default placement per pool, matching the node groups of the Pulumi program: nodes are
    labelled ``POOL_LABEL=<pool>`` and only GPU nodes are tainted (provisioning/components/nodepools.py).
    """
    selector = {POOL_LABEL: pool}
    tolerations: list[Toleration] = []
    if pool == "gpu":
        tolerations.append(Toleration(GPU_RESOURCE, operator="Exists"))
    return JobOptions(namespace=namespace, service_account=service_account,
                      node_selector=selector, tolerations=tuple(tolerations))


def job_name(spec: LaunchSpec) -> str:
    # DNS-1123, <= 63 chars, unique per attempt.
    return f"gd-{spec.attempt_id.replace('-', '')[:20]}-a{spec.attempt_number}".lower()


def job_labels(spec: LaunchSpec) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/managed-by": "gameday-agent",
        "app.kubernetes.io/name": "ml-workload",
        f"{LABEL_PREFIX}/operation-id": spec.operation_id,
        f"{LABEL_PREFIX}/attempt-id": spec.attempt_id,
        f"{LABEL_PREFIX}/attempt-number": str(spec.attempt_number),
    }
    if spec.workload_class:
        labels[f"{LABEL_PREFIX}/workload-class"] = spec.workload_class
    return labels


def capacity_types(spec: LaunchSpec) -> tuple[str, ...]:
    """Spot only when the submission asked for it and its class checkpoints (the API refuses
    anything else; checked again here, where the pod is placed)."""
    wc = workload_classes.CLASSES.get(spec.workload_class or "")
    if spec.interruptible and wc is not None and wc.checkpointable:
        return wc.capacity_types
    return ("on-demand",)


def build_job(spec: LaunchSpec, options: JobOptions) -> dict[str, Any]:
    """The Job manifest for one attempt (a plain dict, as the API and the schema see it)."""
    labels = job_labels(spec)
    limits: dict[str, str] = {"cpu": str(spec.cpu), "memory": _scale(options.memory_per_cpu, spec.cpu)}
    requests = dict(limits)
    if spec.accelerator_count:
        # Extended resources must have request == limit; setting the limit implies the request.
        limits[GPU_RESOURCE] = str(spec.accelerator_count)
        requests[GPU_RESOURCE] = str(spec.accelerator_count)
    env = [
        {"name": "GAMEDAY_OPERATION_ID", "value": spec.operation_id},
        {"name": "GAMEDAY_ATTEMPT_ID", "value": spec.attempt_id},
        {"name": "ARTIFACT_BUCKET", "value": spec.bucket},
    ]
    if spec.s3_endpoint:
        env.append({"name": "S3_ENDPOINT_URL", "value": spec.s3_endpoint})
    wc = workload_classes.CLASSES.get(spec.workload_class or "")
    security = wc.security if wc else workload_classes.SecurityContext()
    if wc:
        env.append({"name": "LOG_LEVEL", "value": wc.logging.level})
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": wc.service_account if wc else options.service_account,
        # Workloads never talk to the Kubernetes API: no token in the pod (isolation).
        "automountServiceAccountToken": False,
        "nodeSelector": dict(options.node_selector),
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{
                "key": CAPACITY_TYPE_LABEL, "operator": "In",
                "values": list(capacity_types(spec))}]}]}}},
        "tolerations": [t.to_manifest() for t in options.tolerations],
        "securityContext": {
            "runAsNonRoot": security.run_as_non_root,
            "runAsUser": options.run_as_user,
            "runAsGroup": options.run_as_user,
            "fsGroup": options.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": "workload",
            "image": spec.image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["python", "-u", "-m", "controlplane.workload"],
            "args": workload_args(spec),
            "env": env,
            "resources": {"requests": requests, "limits": limits},
            "securityContext": security.container(),
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        }],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}],
    }
    if options.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in options.image_pull_secrets]
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "ttlSecondsAfterFinished": options.ttl_seconds_after_finished,
        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
    }
    if spec.timeout_seconds:
        job_spec["activeDeadlineSeconds"] = int(spec.timeout_seconds)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(spec), "namespace": options.namespace, "labels": labels,
                     "annotations": {f"{LABEL_PREFIX}/project": spec.project}},
        "spec": job_spec,
    }


def class_pod_template(wc: workload_classes.WorkloadClass, options: JobOptions,
                       image: str) -> dict[str, Any]:
    """What a Job of the class looks like before any attempt: ``build_job``'s pod for the
    class's defaults, with the capacity it may use (spot only when checkpointable) and no
    per-attempt ids. The Pulumi program publishes it as a PodTemplate per workload namespace,
    so teams see exactly what the agents will create."""
    accel = wc.defaults.get("resources.accelerator") or {}
    job = build_job(LaunchSpec(
        operation_id="template", attempt_id="template", attempt_number=1, project="template",
        kind="sleep", image=image, params={}, cpu=int(wc.defaults.get("resources.cpu", 1)),
        accelerator_type=accel.get("type"), accelerator_count=int(accel.get("count", 0)),
        timeout_seconds=None, workload_class=wc.name, interruptible=wc.checkpointable,
    ), options)
    template = job["spec"]["template"]
    keep = ("app.kubernetes.io/managed-by", "app.kubernetes.io/name",
            f"{LABEL_PREFIX}/workload-class")
    template["metadata"]["labels"] = {k: v for k, v in template["metadata"]["labels"].items()
                                      if k in keep}
    template["metadata"]["annotations"] = {
        f"{LABEL_PREFIX}/storage": ",".join(f"{c.prefix}:{c.access}" for c in wc.storage),
        f"{LABEL_PREFIX}/log-retention-days": str(wc.logging.retention_days),
        f"{LABEL_PREFIX}/checkpointable": str(wc.checkpointable).lower(),
    }
    container = template["spec"]["containers"][0]
    container.pop("args")
    container["env"] = [e for e in container["env"] if not e["name"].startswith("GAMEDAY_")]
    return template


def _scale(quantity: str, factor: int) -> str:
    for unit in ("Gi", "Mi", "Ki"):
        if quantity.endswith(unit):
            return f"{int(quantity[: -len(unit)]) * factor}{unit}"
    return str(int(quantity) * factor)


# --- pod -> verdict ------------------------------------------------------------------------


class PodPhase(Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class PodVerdict:
    phase: PodPhase
    reason: str | None = None
    transient: bool = True


# Waiting reasons that end the attempt (Kubernetes would keep backing off forever otherwise).
_START_FAILURES: dict[str, bool] = {  # reason -> transient
    "ImagePullBackOff": True,
    "ErrImagePull": True,
    "InvalidImageName": False,
    "CreateContainerConfigError": False,  # missing secret/configmap: fix the config first
    "CreateContainerError": True,
    "CrashLoopBackOff": True,
}


def _get(obj: Any, name: str) -> Any:
    """Attribute of a client model, or key of a raw dict (watch events carry both forms)."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        camel = "".join(p if i == 0 else p.capitalize() for i, p in enumerate(name.split("_")))
        return obj.get(camel, obj.get(name))
    return getattr(obj, name, None)


def classify_pod(pod: Any) -> PodVerdict:
    """Map a pod (``V1Pod`` or its JSON dict) to pending/running/succeeded/failed + reason."""
    status = _get(pod, "status")
    phase = _get(status, "phase") or "Pending"
    pod_reason = _get(status, "reason")
    message = _get(status, "message") or ""

    if pod_reason == "Evicted" or any(
        _get(c, "type") == "DisruptionTarget" and _get(c, "status") == "True"
        for c in _get(status, "conditions") or []
    ):
        return PodVerdict(PodPhase.FAILED, f"evicted: {message or pod_reason or 'disruption'}".strip(),
                          transient=True)

    for cs in _get(status, "container_statuses") or []:
        state = _get(cs, "state")
        waiting = _get(state, "waiting")
        terminated = _get(state, "terminated")
        if waiting is not None and _get(waiting, "reason") in _START_FAILURES:
            reason = _get(waiting, "reason")
            return PodVerdict(PodPhase.FAILED, f"start failed: {reason}: {_get(waiting, 'message') or ''}"
                              .rstrip(": "), transient=_START_FAILURES[reason])
        if terminated is not None:
            t_reason = _get(terminated, "reason") or ""
            code = _get(terminated, "exit_code")
            if t_reason == "OOMKilled":
                # Same resources, same data: it would OOM again.
                return PodVerdict(PodPhase.FAILED, f"oom_killed: container exceeded its memory limit "
                                  f"(exit {code})", transient=False)
            if code == 0:
                return PodVerdict(PodPhase.SUCCEEDED, "workload exited 0")
            return PodVerdict(PodPhase.FAILED, f"workload exited {code} ({t_reason or 'Error'})",
                              transient=code != 2)

    if phase == "Succeeded":
        return PodVerdict(PodPhase.SUCCEEDED, "pod succeeded")
    if phase == "Failed":
        return PodVerdict(PodPhase.FAILED, f"pod failed: {pod_reason or ''} {message}".strip())
    if phase == "Running":
        return PodVerdict(PodPhase.RUNNING)

    for cond in _get(status, "conditions") or []:
        if _get(cond, "type") == "PodScheduled" and _get(cond, "status") == "False":
            return PodVerdict(PodPhase.PENDING, f"{_get(cond, 'reason') or 'Unschedulable'}: "
                              f"{_get(cond, 'message') or ''}".rstrip(": "))
    for cs in _get(status, "container_statuses") or []:
        waiting = _get(_get(cs, "state"), "waiting")
        if waiting is not None and _get(waiting, "reason"):
            return PodVerdict(PodPhase.PENDING, str(_get(waiting, "reason")))
    return PodVerdict(PodPhase.PENDING, "pod pending")


def classify_job(job: Any) -> PodVerdict | None:
    """A terminal verdict from the Job's own conditions (e.g. deadline exceeded), else None."""
    for cond in _get(_get(job, "status"), "conditions") or []:
        if _get(cond, "status") != "True":
            continue
        if _get(cond, "type") == "Failed":
            reason = _get(cond, "reason") or "Failed"
            return PodVerdict(PodPhase.FAILED, f"job failed: {reason}: {_get(cond, 'message') or ''}"
                              .rstrip(": "), transient=reason != "DeadlineExceeded")
        if _get(cond, "type") == "Complete":
            return PodVerdict(PodPhase.SUCCEEDED, "job complete")
    return None


# --- runtime -------------------------------------------------------------------------------

PodWatch = Callable[[str, str], Iterable[Mapping[str, Any]]]
"""(namespace, label_selector) -> watch events ``{"type": ..., "object": V1Pod}``."""
LogStream = Callable[[str, str], Iterable[str]]
"""(namespace, pod_name) -> log lines, following the container until it ends."""


class KubernetesRunHandle:
    def __init__(self, spec: LaunchSpec, options: JobOptions, pods: Iterable[Mapping[str, Any]],
                 logs: LogStream, delete_job: Callable[[], None]) -> None:
        self.spec = spec
        self.options = options
        self._logs = logs
        self._delete_job = delete_job
        self._events: queue.SimpleQueue[WorkloadEvent] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._verdict: PodVerdict = PodVerdict(PodPhase.PENDING, "job created")
        self._ended = threading.Event()  # the pod succeeded or failed: wait() returns
        self._log_thread: threading.Thread | None = None
        self._watch_thread = threading.Thread(target=self._watch, args=(pods,), daemon=True,
                                              name=f"k8s-watch-{spec.attempt_id[:8]}")
        self._watch_thread.start()

    def _watch(self, pods: Iterable[Mapping[str, Any]]) -> None:
        for event in pods:
            pod = event.get("object")
            if event.get("type") == "DELETED" and self._verdict.phase in (PodPhase.PENDING, PodPhase.RUNNING):
                self._set(PodVerdict(PodPhase.FAILED, "pod deleted before it finished"))
                break
            verdict = classify_pod(pod)
            if verdict.phase is not PodPhase.PENDING and self._log_thread is None:
                self._follow_logs(_get(_get(pod, "metadata"), "name"))
            self._set(verdict)
            if verdict.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED):
                break

    def _follow_logs(self, pod_name: str) -> None:
        def run() -> None:
            for line in self._logs(self.options.namespace, pod_name):
                self._events.put(parse_line(line))

        self._log_thread = threading.Thread(target=run, daemon=True, name=f"k8s-logs-{pod_name}")
        self._log_thread.start()

    def _set(self, verdict: PodVerdict) -> None:
        with self._lock:
            self._verdict = verdict
        if verdict.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED):
            self._ended.set()

    def drain_events(self) -> list[WorkloadEvent]:
        out: list[WorkloadEvent] = []
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out

    def result(self) -> RunResult | None:
        with self._lock:
            verdict = self._verdict
        if verdict.phase is PodPhase.SUCCEEDED:
            if self._log_thread is not None:
                self._log_thread.join(timeout=5)  # the last events (artifact_written) come first
            return RunResult(Outcome.SUCCEEDED, verdict.reason or "succeeded", exit_code=0)
        if verdict.phase is PodPhase.FAILED:
            return RunResult(Outcome.FAILED, verdict.reason or "failed", transient=verdict.transient)
        return None

    def pending_reason(self) -> str | None:
        with self._lock:
            return self._verdict.reason if self._verdict.phase is PodPhase.PENDING else None

    def wait(self, timeout: float) -> None:
        self._ended.wait(timeout)

    def stop(self, grace_seconds: float = 2.0) -> None:
        self._delete_job()


class KubernetesRuntime:
    """Creates Jobs with the official client; ``batch``/``core`` are ``BatchV1Api``/``CoreV1Api``."""

    name = "kubernetes"

    def __init__(self, batch: Any, core: Any, options: JobOptions,
                 watch_pods: PodWatch | None = None, stream_logs: LogStream | None = None) -> None:
        self.batch = batch
        self.core = core
        self.options = options
        self._watch_pods = watch_pods or self._default_watch
        self._stream_logs = stream_logs or self._default_logs

    @classmethod
    def from_kubeconfig(cls, options: JobOptions) -> KubernetesRuntime:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(client.BatchV1Api(), client.CoreV1Api(), options)

    def _default_watch(self, namespace: str, selector: str) -> Iterator[Mapping[str, Any]]:
        from kubernetes import watch

        # Re-list on every reconnect so a dropped watch cannot miss a terminal transition.
        while True:
            yield from watch.Watch().stream(self.core.list_namespaced_pod, namespace,
                                            label_selector=selector, timeout_seconds=60)

    def _default_logs(self, namespace: str, pod: str) -> Iterator[str]:
        response = self.core.read_namespaced_pod_log(pod, namespace, container="workload",
                                                     follow=True, _preload_content=False)
        for raw in response.stream():
            yield from raw.decode(errors="replace").splitlines()

    def start(self, spec: LaunchSpec) -> KubernetesRunHandle:
        manifest = build_job(spec, self.options)
        name = manifest["metadata"]["name"]
        self.batch.create_namespaced_job(self.options.namespace, manifest)
        selector = f"{LABEL_PREFIX}/attempt-id={spec.attempt_id}"

        def delete() -> None:
            self.batch.delete_namespaced_job(name, self.options.namespace,
                                             propagation_policy="Background")

        return KubernetesRunHandle(spec, self.options, self._watch_pods(self.options.namespace, selector),
                                   self._stream_logs, delete)


def pod_from_json(data: Mapping[str, Any] | str) -> Any:
    """Deserialize a recorded pod (API JSON) into the client's ``V1Pod`` model."""
    from kubernetes.client import ApiClient

    class _Response:
        def __init__(self, body: str) -> None:
            self.data = body

    body = data if isinstance(data, str) else json.dumps(data)
    return ApiClient().deserialize(_Response(body), "V1Pod")
