"""A cloud environment (``dev`` / ``staging`` / ``prod``) as the game-day runner and the chaos
layer see it: the part of ``environments.local.env.LocalEnvironment`` they use (endpoints, tokens,
state dir, fault timeline, health, notes, agents), built from an explicit target file.

There is no ``up``/``down`` here: a cloud environment is provisioned by ``pulumi up`` and must
already exist. The target file is JSON: the keys of ``environments.cloud.driver.CloudTarget`` (the
stack outputs the fault drivers need) plus the runner's own keys below. Credentials are never
in the file: it names the environment variables that hold them (a Kubernetes Secret mounted
as env vars in the CronJob), and their values are never printed or written to a run directory.

=================  ========  =======================================================
runner key         required  meaning
=================  ========  =======================================================
``apiUrl``         yes       control-plane API base URL, as the runner reaches it
``prometheusUrl``  yes       Prometheus base URL (alerts and queries for the evidence)
``workloadImage``  yes       image of the sample training workload the load submits
``platformProject`` no       control-plane project the runner submits as (``gameday``)
``adminDsnEnv``    no        env var holding the store's DSN (``GAMEDAY_ADMIN_DSN``)
``projectTokenEnv`` no       env var holding that project's token (``GAMEDAY_PROJECT_TOKEN``)
``agentTokenEnv``  no        env var holding an agent token (``GAMEDAY_AGENT_TOKEN``), for the
                             fencing probe that replays a stale agent's late report
``leaseSeconds``   no        game-day Lease duration (120); renewed every third of it
=================  ========  =======================================================
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from environments.environment_types import (
    ENVIRONMENTS,
    EnvironmentRefused,
    EnvironmentUnavailable,
    EvidenceNeeds,
    OpenRun,
    RunRequest,
    poll,
)
from environments.schedule import ScheduleError

CLOUD_ENVS = tuple(name for name, kind in ENVIRONMENTS.items() if kind == "cloud")
# What ``gameday run`` hands the experiments' Chaos Toolkit processes (chaos/context.py builds
# the same CloudEnvironment from them); the experiments' configuration stays as it is.
CLOUD_TARGET_ENV = "GAMEDAY_TARGET"  # the target file
CLOUD_STATE_ENV = "GAMEDAY_CLOUD_STATE_DIR"  # fault state + timeline shared with the runner
ALLOW_PROD_ENV = "GAMEDAY_ALLOW_PROD"
# No HAProxy in front of the API in the cloud (a Service): the API's own request counter, as
# the cloud SLO rules read it (slo/metrics.py API_REQUEST_SOURCES["api"]), by status code.
PROMETHEUS_QUERIES: dict[str, str | None] = {
    "api_requests": ('sum by (code) (rate(controlplane_http_requests_total'
                     '{route!~"/healthz|/readyz|/metrics"}[30s]))'),
}
# Always true of a cloud run; written to collection-gaps.json so nobody looks for them.
KNOWN_GAPS = {
    "component logs": "pod logs are not copied into the run directory; read them with "
                      "kubectl logs in the control-plane namespace",
}
DEFAULT_SECRET_ENVS = {"adminDsnEnv": "GAMEDAY_ADMIN_DSN", "projectTokenEnv": "GAMEDAY_PROJECT_TOKEN",
                       "agentTokenEnv": "GAMEDAY_AGENT_TOKEN"}
RUNNER_KEYS = ("apiUrl", "prometheusUrl", "workloadImage", "platformProject", "leaseSeconds",
               *DEFAULT_SECRET_ENVS)
URL_KEYS = ("apiUrl", "prometheusUrl")
# Experiments written for the local topology only, and why they cannot run against a stack.
NOT_APPLICABLE = {
    "ineligible-fallback-region": "needs agents in two regions (region-1/region-2 of the local "
                                  "topology); a cloud stack runs its agents in one region",
    "db-unreachable-from-api-replica": "needs one API replica cut off from the database "
                                       "while the other keeps it: the cloud drivers cannot "
                                       "isolate one pod from RDS yet (local only)",
    "credential-rotation": "rotates the local environment's token files and database "
                           "password; a stack's secrets live in its secret store (not driven "
                           "yet: local only)",
    "zone-outage": "names the local topology's zones (zone-a/zone-b) and its members (api-1, "
                   "pg-0, agents); the cloud drivers' zone_outage takes an availability zone and "
                   "was tested offline only (moto, recorded cluster): docs/chaos-cloud.md",
    "db-restore-from-backup": "would replace the stack's database: on AWS the restore is a "
                              "point-in-time restore to a new RDS instance, rehearsed on a scratch "
                              "stack by hand (runbooks/db-primary-loss.md B)",
    "clock-skew": "steps a process's wall clock through its injectable clock source, which "
                  "only the local environment's processes read (docs/clock.md); the cloud "
                  "drivers do not step node clocks",
    "pipeline-recovery": "needs the image pinned by digest (the local registry's push names "
                         "it; a stack's target does not record one yet, so no step would be "
                         "cacheable) and writes its dataset to the artifact bucket: run and "
                         "tested on the local environment only",
    "data-source-unavailable": "corrupts and deletes a source object through the local "
                               "fault driver's timeline (the cloud drivers record no such "
                               "fault yet) and needs the image pinned by digest: local only",
    "tracking-outage": "kills MLflow's tracking server process and reads its runs back "
                       "through the local environment's endpoint (`gameday env up "
                       "--tracking`); a stack's tracking Deployment (namespace mlp-tracking, "
                       "docs/infra.md) has no fault target or endpoint in the cloud driver yet "
                       "and this experiment never ran against one: local only",
    "network-gray": "adds toxics (latency, resets, silent connections) to the local fault "
                    "proxy's agent routes. The cloud driver maps toxics to Chaos Mesh "
                    "NetworkChaos (latency as delay, full silence as 100 % loss; tested offline "
                    "only, docs/chaos-cloud.md), but two of this experiment's toxics have no "
                    "equivalent and are refused: connections-reset (reset_peer: nothing in "
                    "NetworkChaos sends a TCP reset) and silent-connections (toxicity 0.1 is "
                    "one connection in ten; netem drops per packet): local only",
    "artifact-store-brownout": "answers S3 requests late or with 503 SlowDown through the "
                               "local S3 server's brownout layer; nothing browns out a real "
                               "S3 bucket (an S3 deny policy is an outage, not a brownout): "
                               "local only",
    "db-slow-disk": "slows the database primary's disk through the local storage layer (faultfs "
                    "under each Patroni member's data directory); RDS storage cannot be slowed "
                    "from outside (a throttled gp3 volume would be the equivalent: not driven, "
                    "local only)",
    "db-disk-full": "fills the database primary's WAL disk through the local storage layer "
                    "(faultfs ENOSPC); an RDS instance's storage cannot be filled on purpose "
                    "without filling it with data (not driven, local only)",
    "overload-metastability": "slows every API replica's route to the database with a toxic "
                              "on the local fault proxy, and its open-loop load is refused for "
                              "anything but 127.0.0.0/8 (loadtests/safety.py); the cloud "
                              "drivers' gray network fault (Chaos Mesh) covers only the agents' "
                              "route to the API, not the API's to RDS: local only",
    "checkpoint-power-loss": "cuts an agent host's power through the local storage layer "
                             "(faultfs under the agent's node-local checkpoint directory drops "
                             "every unsynced write); the cloud equivalent would be a hard stop "
                             "of the node's instance with its local NVMe (instance store) kept, "
                             "which EC2 does not offer (a stopped instance loses its instance "
                             "store, a rebooted one keeps what the page cache had flushed): not "
                             "driven, local only",
    "serving-replica-loss": "SIGKILLs one of the local KServe model-server processes behind "
                            "HAProxy's serving frontend and slows the local fault proxy's S3 "
                            "route while it reloads its model; the cloud stack's serving "
                            "(Argo Rollouts + KEDA) is declared in the Pulumi program but no "
                            "cloud driver deletes a serving pod yet: local only",
    "bad-model-rollout": "rolls a bad model version out through the local rollout controller "
                         "(HAProxy weights on the local serving frontend, the canary replica "
                         "redeployed as a local process); the cloud stack's rollouts (Argo "
                         "Rollouts' canary analysis) are declared in the Pulumi program but no "
                         "cloud driver starts one yet: local only",
    "model-store-unavailable": "cuts the local fault proxy's S3 route while a third local "
                               "KServe model-server process is started and enabled in "
                               "HAProxy's serving backend; the cloud stack's serving (Argo "
                               "Rollouts + KEDA) is declared in the Pulumi program but no cloud "
                               "driver scales a serving deployment or cuts its model store "
                               "yet: local only",
    "upgrade": "rolls the reference control plane's processes between two releases built into "
               "one image (CONTROLPLANE_RELEASE); a cloud stack deploys one image tag, so the "
               "rehearsal is local only (docs/upgrades.md)",
}


class CloudEnvError(Exception):
    """The cloud target cannot be used (message names the file, key or variable and why)."""


@dataclass(frozen=True)
class CloudAgent:
    name: str
    pool: str
    region: str


@dataclass(frozen=True)
class CloudTargetFile:
    """The validated target file; secrets are not read here (``--dry-run`` uses this too)."""

    path: Path
    environment: str
    api_url: str
    prometheus_url: str
    workload_image: str
    platform_project: str
    secret_envs: dict[str, str]  # runner key -> environment variable name
    lease_seconds: int
    driver_config: dict[str, Any]  # what CloudFaults takes (CloudTarget.KEYS only)

    @classmethod
    def load(cls, path: Path, env: str) -> CloudTargetFile:
        from environments.cloud.driver import CloudConfigError, CloudTarget

        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except OSError as exc:
            raise CloudEnvError(f"target file {path}: cannot read it: {exc.strerror}") from None
        except ValueError as exc:
            raise CloudEnvError(f"target file {path}: not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise CloudEnvError(f"target file {path}: a JSON object is expected, got "
                                f"{type(raw).__name__}")
        for key in ("apiUrl", "prometheusUrl", "workloadImage"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise CloudEnvError(f"target file {path}: key {key!r} is required (a non-empty "
                                    "string); see docs/chaos-cloud.md, 'Live game days'")
        for key in URL_KEYS:
            url = urlparse(raw[key])
            if url.scheme not in ("http", "https") or not url.netloc:
                raise CloudEnvError(f"target file {path}: key {key!r}: {raw[key]!r} is not an "
                                    "http(s) URL")
        secret_envs = {k: raw.get(k, default) for k, default in DEFAULT_SECRET_ENVS.items()}
        for key, var in secret_envs.items():
            if not isinstance(var, str) or not var.isidentifier():
                raise CloudEnvError(f"target file {path}: key {key!r} must name an environment "
                                    f"variable, got {var!r}")
        lease = raw.get("leaseSeconds", 120)
        if not isinstance(lease, int) or not 30 <= lease <= 3600:
            raise CloudEnvError(f"target file {path}: key 'leaseSeconds' must be an integer "
                                f"in [30, 3600], got {lease!r}")
        driver_config = {k: v for k, v in raw.items() if k not in RUNNER_KEYS}
        try:
            # an inline kubeconfig is only written out when the driver is built (state dir)
            target = CloudTarget.from_config(
                {k: v for k, v in driver_config.items() if k != "kubeconfig"}, state_dir=None)
        except CloudConfigError as exc:
            raise CloudEnvError(f"target file {path}: {exc}") from None
        if target.environment != env:
            raise CloudEnvError(f"target file {path}: key 'environment' is "
                                f"{target.environment!r} but --env is {env!r}: wrong target?")
        return cls(path=path.resolve(), environment=env, api_url=raw["apiUrl"].rstrip("/"),
                   prometheus_url=raw["prometheusUrl"].rstrip("/"),
                   workload_image=raw["workloadImage"],
                   platform_project=str(raw.get("platformProject", "gameday")),
                   secret_envs=secret_envs, lease_seconds=lease, driver_config=driver_config)

    def secret(self, key: str) -> str:
        var = self.secret_envs[key]
        value = os.environ.get(var, "")
        if not value.strip():
            raise CloudEnvError(f"environment variable {var} (target key {key!r} of "
                                f"{self.path}) is not set or empty: the cloud runner needs it")
        return value


def state_dir_for(env: str, home: Path | None = None) -> Path:
    """Fault state, kubeconfig copy and fault timeline of one cloud environment."""
    base = home or Path(os.environ.get("GAMEDAY_HOME") or os.getcwd())
    return base.resolve() / ".gameday" / "cloud" / env


class CloudEnvironment:
    """What ``gameday run`` and ``chaos.context.Context`` use of an environment, for a stack."""

    kind = "cloud"
    components = ("api", "database", "prometheus", "deployments")
    remote = True
    budget_source = "prometheus"  # the stack's own, which holds the SLO rules
    durability_stream = False  # its held queue is the local reference control plane's
    sigterm_is_interrupt = True  # a pod's deadline or a node drain ends the run, rolled back
    database_backups_here = False  # RDS: a point-in-time restore (runbooks/db-primary-loss.md)

    def __init__(self, target: CloudTargetFile, state_dir: Path, *, allow_prod: bool = False,
                 kube_api: Any = None) -> None:
        if target.environment == "prod" and not allow_prod:
            raise CloudEnvError("refusing to inject faults into prod without --allow-prod")
        self.target = target
        self.name = target.environment
        self.state_dir = Path(state_dir)
        self.allow_prod = allow_prod
        self._kube_api = kube_api
        # read (and checked) once, before anything is touched
        self._dsn = target.secret("adminDsnEnv")
        self._tokens = {"projects": {target.platform_project: target.secret("projectTokenEnv")},
                        "agent": target.secret("agentTokenEnv")}
        self.info = {"platform": "controlplane", "kind": "cloud", "environment": self.name,
                     "target": str(target.path)}

    @classmethod
    def from_target(cls, path: Path, env: str, *, home: Path | None = None,
                    state_dir: Path | None = None, allow_prod: bool = False) -> CloudEnvironment:
        if env not in CLOUD_ENVS:
            raise CloudEnvError(f"env {env!r} is not a cloud environment ({', '.join(CLOUD_ENVS)})")
        return cls(CloudTargetFile.load(path, env), state_dir or state_dir_for(env, home),
                   allow_prod=allow_prod)

    # -- a game day on it (environments/base.py EnvironmentKind) ----------------------------
    @classmethod
    def refusal(cls, req: RunRequest) -> str | None:
        if req.target is None:
            return (f"env {req.env} needs an explicit --target (the stack outputs JSON of "
                    "`pulumi stack output --json -s <stack>`)")
        if req.env == "prod" and not req.allow_prod:
            return "refusing to inject faults into prod without --allow-prod"
        return None

    @classmethod
    def dry_run(cls, req: RunRequest) -> Iterator[str]:
        """What a live run would hit, from the target file alone (no credentials, no API
        call); a target a live run would refuse raises EnvironmentUnavailable."""
        assert req.target is not None  # refusal() said so before
        yield f"target: {req.target} (cloud drivers: Kubernetes + AWS)"
        try:
            t = CloudTargetFile.load(req.target, req.env)
        except CloudEnvError as exc:
            raise EnvironmentUnavailable(str(exc)) from None
        cfg = t.driver_config
        yield (f"targets: API {t.api_url}, Prometheus {t.prometheus_url}, cluster "
               f"{cfg.get('clusterName', '(derived)')} in {cfg['region']}, namespace "
               f"{cfg.get('controlPlaneNamespace', 'mlp-controlplane')}, bucket(s) "
               f"{cfg.get('artifactBuckets') or cfg.get('artifactBucket') or 'none'}")
        yield ("credentials from env vars " + ", ".join(sorted(t.secret_envs.values()))
               + "; lock: Lease gameday-lock in the control-plane namespace")

    @classmethod
    def prometheus_url(cls, req: RunRequest) -> str:
        assert req.target is not None  # refusal() said so before
        try:
            return CloudTargetFile.load(req.target, req.env).prometheus_url
        except CloudEnvError as exc:
            raise EnvironmentUnavailable(f"no Prometheus URL: {exc}") from None

    @classmethod
    @contextmanager
    def open_for_run(cls, req: RunRequest, new_run: Callable[[], tuple[str, Path]],
                     say: Callable[[str], None]) -> Iterator[OpenRun]:
        """The stack must exist already (no up/down); the lock is a Lease in the cluster."""
        from platforms import registry

        assert req.target is not None  # refusal() said so before
        if not registry.get(req.platform).cloud:
            raise EnvironmentRefused(
                f"cloud game days target what provisioning/ deploys; platform {req.platform!r} has "
                "no cloud deployment (platforms/registry.py)")
        try:
            env = cls.from_target(req.target, req.env, home=req.home, allow_prod=req.allow_prod)
            run_id, run_dir = new_run()
            lock = env.lock(run_id)
            lock.acquire({"run_id": run_id, "run_dir": str(run_dir),
                          "host": os.environ.get("HOSTNAME", "")})
        except CloudEnvError as exc:
            raise EnvironmentRefused(str(exc)) from None
        except ScheduleError as exc:
            raise EnvironmentRefused(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - e.g. no kubeconfig: refuse, nothing was touched
            raise EnvironmentRefused(f"cannot reach the cluster of {req.env} "
                                     f"({type(exc).__name__}: {exc})") from None
        say(f"environment {req.env}: API {env.target.api_url}, lock Lease "
            f"{lock.namespace}/{lock.name} held by {run_id}")
        try:
            yield OpenRun(env, run_id, run_dir, lock)
        finally:
            lock.release()

    def run_info(self) -> dict[str, Any]:
        return {"target": self.describe()}

    def chaos_env(self) -> dict[str, str]:
        return {CLOUD_TARGET_ENV: str(self.target.path), CLOUD_STATE_ENV: str(self.state_dir),
                ALLOW_PROD_ENV: "true" if self.allow_prod else "false"}

    @property
    def evidence_needs(self) -> EvidenceNeeds:
        return EvidenceNeeds(queries=PROMETHEUS_QUERIES, known_gaps=KNOWN_GAPS,
                             snapshot_source="DSN from the target's adminDsnEnv",
                             aws_objects=(self.bucket, self.region),
                             active_faults_at=f"{self.fault_state_file} (docs/chaos-cloud.md)")

    # -- files and endpoints ----------------------------------------------------------------
    @property
    def timeline_file(self) -> Path:
        return self.state_dir / "faults.jsonl"

    @property
    def fault_state_file(self) -> Path:
        return self.state_dir / "cloud-faults.json"

    @property
    def endpoints(self) -> dict[str, Any]:
        """Same keys as the local environment's where they exist. No ``s3``: artifacts are in
        AWS S3 behind IAM, reached with the default credential chain, not an endpoint URL."""
        return {"api": self.target.api_url, "prometheus": self.target.prometheus_url,
                "dsn": self._dsn, "image": self.target.workload_image,
                "bucket": self.bucket, "region": self.region,
                "fault_timeline": str(self.timeline_file)}

    @property
    def tokens(self) -> dict[str, Any]:
        return self._tokens

    @property
    def bucket(self) -> str | None:
        cfg = self.target.driver_config
        return cfg.get("artifactBucket") or (cfg.get("artifactBuckets") or [None])[0]

    @property
    def region(self) -> str:
        return self.target.driver_config["region"]

    def describe(self) -> dict[str, Any]:
        """For people and run.json: where it points, never a credential."""
        return {"environment": self.name, "target": str(self.target.path),
                "api": self.target.api_url, "prometheus": self.target.prometheus_url,
                "bucket": self.bucket, "region": self.region,
                "namespace": self.driver.driver.target.kube.namespace,
                "state_dir": str(self.state_dir)}

    # -- fault driver and lock --------------------------------------------------------------
    @cached_property
    def driver(self) -> Any:
        from environments.cloud.driver import CloudFaults
        from environments.cloud.recorded import RecordedCloudFaults
        from environments.timeline import Timeline

        faults = CloudFaults(self.target.driver_config, self.fault_state_file,
                             allow_prod=self.allow_prod)
        return RecordedCloudFaults(faults, Timeline(self.timeline_file))

    def kube_api(self) -> Any:
        """The Kubernetes ApiClient the drivers use (kubeconfig of the target, or in-pod)."""
        if self._kube_api is None:
            self._kube_api = self.driver.driver.k8s.kube.api()
        return self._kube_api

    def lock(self, holder: str) -> Any:
        from kubernetes import client

        from environments.cloud.lock import LeaseLock

        return LeaseLock(client.CoordinationV1Api(self.kube_api()),
                         self.driver.driver.target.kube.namespace, holder,
                         lease_seconds=self.target.lease_seconds)

    # -- topology ---------------------------------------------------------------------------
    @property
    def agents(self) -> tuple[CloudAgent, ...]:
        kube = self.driver.driver.target.kube
        return tuple(CloudAgent(f"{kube.agent_name_prefix}-{pool}", pool, self.region)
                     for pool in kube.agent_pools)

    def applicability(self, experiment: str, requires: Sequence[str] = ()) -> str | None:
        return NOT_APPLICABLE.get(experiment) or (
            f"needs {', '.join(requires)}, which only the local environment provides"
            if requires else None)

    # -- health -----------------------------------------------------------------------------
    def db_writable(self, timeout: float = 2.0) -> bool:
        """True when the store assigns a transaction id: only a primary does (a standby or an
        instance mid-failover refuses). Writes nothing to the platform's tables."""
        import psycopg

        try:
            with psycopg.connect(self._dsn, autocommit=True,
                                 connect_timeout=max(1, int(timeout))) as conn:
                conn.execute(f"SET statement_timeout = {int(timeout * 1000)}")
                conn.execute("SELECT txid_current()")
            return True
        except psycopg.Error:
            return False

    def wait_db_writable(self, timeout: float) -> float:
        seconds = poll(self.db_writable, timeout, 0.5)
        if seconds is not None:
            return seconds
        raise CloudEnvError(f"{self.name}: the control-plane database accepted no write "
                            f"within {timeout:.0f} s")

    def _http_ok(self, url: str) -> tuple[bool, str]:
        try:
            r = httpx.get(url, timeout=3.0)
        except httpx.HTTPError as exc:
            return False, f"{url}: {type(exc).__name__}"
        return r.status_code == 200, f"{urlparse(url).path} {r.status_code}"

    def deployments(self) -> tuple[bool, str]:
        """Every control-plane Deployment has all its replicas ready (and at least one)."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        kube = self.driver.driver.target.kube
        names = ["controlplane-api", "controlplane-reconciler",
                 *(f"controlplane-agent-{p}" for p in kube.agent_pools)]
        apps = client.AppsV1Api(self.kube_api())
        bad = []
        for name in names:
            try:
                d = apps.read_namespaced_deployment(name, kube.namespace)
            except ApiException as exc:
                bad.append(f"{name}: HTTP {exc.status}")
                continue
            want = d.spec.replicas or 0
            ready = (d.status.ready_replicas if d.status else None) or 0
            if want == 0 or ready < want:
                bad.append(f"{name}: {ready}/{want} ready")
        return not bad, "; ".join(bad) or f"{len(names)} deployments ready"

    def status(self) -> dict[str, Any]:
        checks = {
            "api": self._http_ok(f"{self.target.api_url}/readyz"),
            "database": (True, "writable") if self.db_writable() else (False, "not writable"),
            "prometheus": self._http_ok(f"{self.target.prometheus_url}/-/ready"),
            "deployments": self.deployments(),
        }
        components = {n: {"healthy": ok, "detail": detail} for n, (ok, detail) in checks.items()}
        return {"name": self.name, "kind": self.kind, "components": components,
                "healthy": all(c["healthy"] for c in components.values()),
                "active_faults": self.driver.active()}

    def wait_healthy(self, components: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            bad = {n: c["detail"] for n, c in status["components"].items()
                   if n in components and not c["healthy"]}
            if not bad:
                return
            if time.monotonic() >= deadline:
                raise CloudEnvError(f"{self.name}: not healthy within {timeout:.0f} s: {bad}")
            time.sleep(2.0)

    def note(self, what: str, details: dict[str, Any] | None = None) -> None:
        from environments.timeline import Timeline

        Timeline(self.timeline_file).record("note", what, self.name, details or {})
