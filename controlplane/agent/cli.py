"""``gameday controlplane agent``: one agent process (CONTRACTS.md section 2)."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import click

from controlplane import storage
from controlplane.agent.api import AgentApi, ApiRejected, TokenFile
from controlplane.agent.attempt import RunnerSettings
from controlplane.agent.capacity import Capacity
from controlplane.agent.loop import Agent, AgentIdentity, LoopSettings
from controlplane.agent.metrics import AgentMetrics
from controlplane.agent.spool import Spool, SpoolBusy
from controlplane.runtimes.base import Runtime


def default_spool_dir(name: str, api_url: str) -> Path:
    """The agent has no work/state directory of its own, so: a temp dir per agent name.

    The user id and a hash of the API URL are part of it so two environments on one machine
    whose agents share a name never adopt each other's leftovers.
    """
    api = hashlib.sha256(api_url.encode()).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / f"controlplane-agent-{os.getuid()}-{name}-{api}" / "spool"


def _runtime(name: str, pool: str, namespace: str, service_account: str) -> Runtime:
    if name == "local":
        from controlplane.runtimes.local import LocalRuntime

        return LocalRuntime()
    from controlplane.runtimes.kubernetes import KubernetesRuntime, pool_options

    return KubernetesRuntime.from_kubeconfig(pool_options(pool, namespace, service_account))


@click.command("agent", context_settings={"show_default": True})
@click.option("--api", "api_url", required=True, envvar="CONTROLPLANE_API_URL",
              help="Control-plane API base URL.")
@click.option("--token", default=None, envvar="CONTROLPLANE_AGENT_TOKEN",
              help="Agent bearer token (prefer the env var: argv is visible in ps). Fixed for "
                   "the process's life: use --token-file where tokens are rotated.")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              envvar="CONTROLPLANE_AGENT_TOKEN_FILE",
              help="File holding the agent token, re-read when it changes (credential "
                   "rotation replaces it; the next request uses the new token).")
@click.option("--name", required=True, help="Stable agent name (re-registering keeps its id).")
@click.option("--pool", required=True, help="Node pool, e.g. system, cpu, gpu.")
@click.option("--zone", required=True)
@click.option("--region", required=True)
@click.option("--cpu-slots", type=click.IntRange(min=1), required=True)
@click.option("--accelerator-type", default=None, help="Simulated accelerator type, e.g. sim-a100.")
@click.option("--accelerator-count", type=click.IntRange(min=0), default=0)
@click.option("--dataset", "datasets", multiple=True, help="Dataset available here (repeatable).")
@click.option("--registry", "registries", multiple=True,
              help="Registry HOST:PORT this agent may pull from (repeatable; none = any).")
@click.option("--runtime", type=click.Choice(["local", "kubernetes"]), default="local",
              help="Where workloads run. local: a process group each, below the agent's CPU "
                   "priority (niceness +10; $GAMEDAY_LOCAL_RUNTIME_NICE, 0-19), started by a "
                   "warm parent ($GAMEDAY_LOCAL_RUNTIME_START=subprocess: a fresh interpreter).")
@click.option("--s3-endpoint", default=None, envvar="S3_ENDPOINT_URL",
              help="S3 endpoint URL (unset: AWS S3).")
@click.option("--bucket", default=storage.DEFAULT_BUCKET)
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics on 127.0.0.1:PORT.")
@click.option("--metrics-host", default="127.0.0.1")
@click.option("--poll-seconds", type=click.FloatRange(min=0.05), default=0.5,
              help="Idle claim interval.")
@click.option("--image-timeout", type=click.FloatRange(min=0.1), default=3.0,
              help="Registry request timeout for tag -> digest resolution.")
@click.option("--k8s-namespace", default="ml-workloads", help="Workload namespace (kubernetes runtime).")
@click.option("--k8s-service-account", default="ml-workload",
              help="Workload service account (kubernetes runtime).")
@click.option("--spool-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              show_default=False,
              help="On-disk spool of events not delivered yet (and counters.json). Default: "
              "<tmp>/controlplane-agent-<uid>-<name>-<hash of --api>/spool, since the agent has "
              "no work directory; give it a persistent path so a restart finds leftovers.")
@click.option("--spool-max-bytes", type=click.IntRange(min=1024), default=16 * 1024 * 1024,
              help="Bound on undelivered events in the spool; beyond it the oldest are dropped "
              "(counted, reason spool_full).")
@click.option("--spool-max-age", type=click.FloatRange(min=1.0), default=3600.0,
              help="Seconds after which an undelivered leftover segment is given up (counted, "
              "reason expired).")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), default="INFO")
def agent_cmd(api_url: str, token: str | None, token_file: Path | None, name: str, pool: str, zone: str, region: str,
              cpu_slots: int, accelerator_type: str | None, accelerator_count: int,
              datasets: tuple[str, ...], registries: tuple[str, ...], runtime: str,
              s3_endpoint: str | None, bucket: str, metrics_port: int | None, metrics_host: str,
              poll_seconds: float, image_timeout: float, k8s_namespace: str,
              k8s_service_account: str, spool_dir: Path | None, spool_max_bytes: int,
              spool_max_age: float, log_level: str) -> None:
    """Claim attempts for POOL, run them through RUNTIME, hold their leases, report."""
    logging.basicConfig(level=log_level,
                        format=f"%(asctime)s %(levelname)s agent={name} %(name)s: %(message)s")
    if accelerator_count and not accelerator_type:
        raise click.BadParameter("--accelerator-count needs --accelerator-type",
                                 param_hint="--accelerator-count")
    if token is None and token_file is None:
        raise click.UsageError("no agent token: give --token-file ($CONTROLPLANE_AGENT_TOKEN_FILE) "
                               "or --token ($CONTROLPLANE_AGENT_TOKEN)")
    if token is not None and token_file is not None:
        # the file wins: it is what rotation updates (a --token inherited from a shell is stale)
        logging.getLogger(__name__).warning("both --token and --token-file given: using %s",
                                            token_file)
        token = None
    try:
        credential: str | TokenFile = TokenFile(token_file) if token_file else str(token)
    except ApiRejected as exc:
        raise click.BadParameter(str(exc), param_hint="--token-file") from exc
    metrics = AgentMetrics()
    spool_dir = spool_dir or default_spool_dir(name, api_url)
    try:
        spool = Spool(spool_dir, max_bytes=spool_max_bytes, max_age_seconds=spool_max_age,
                      metrics=metrics)
    except SpoolBusy as exc:
        raise click.BadParameter(str(exc), param_hint="--spool-dir") from exc
    except OSError as exc:
        raise click.BadParameter(f"{spool_dir}: cannot use it as the spool: {exc}",
                                 param_hint="--spool-dir") from exc
    try:  # first: a bad runtime setting ends the command before anything starts
        agent_runtime = _runtime(runtime, pool, k8s_namespace, k8s_service_account)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=metrics_host, registry=metrics.registry)
    store_config = storage.StorageConfig(endpoint_url=s3_endpoint, bucket=bucket)

    stores: list[storage.ObjectStore] = []
    stores_lock = threading.Lock()

    def store_factory() -> storage.ObjectStore:
        # One store (one boto3 client) per agent, shared by its runners: boto3 clients are
        # thread-safe, and building one costs tens of ms of CPU, once per attempt before.
        # A bounded deadline: the runner interleaves retries with lease heartbeats.
        with stores_lock:
            if not stores:
                stores.append(storage.ObjectStore.from_config(
                    store_config, storage.RetryPolicy(deadline_seconds=2.0)))
            return stores[0]

    agent = Agent(
        identity=AgentIdentity(name, pool, zone, region, datasets, registries),
        api=AgentApi(api_url, credential, agent_name=name),
        runtime=agent_runtime,
        capacity=Capacity(cpu_slots, accelerator_type, accelerator_count),
        runner_settings=RunnerSettings(s3_endpoint=s3_endpoint, bucket=bucket, registries=registries,
                                       image_timeout=image_timeout),
        store_factory=store_factory,
        spool=spool,
        metrics=metrics,
        settings=LoopSettings(poll_seconds=poll_seconds),
    )
    _stop_on_signals(agent.stop)
    agent.run()


def _stop_on_signals(stop: Callable[[], None]) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        logging.getLogger(__name__).info("signal %d: draining", signum)
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
