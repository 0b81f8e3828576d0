"""Chaos Toolkit actions: faults (through the environment's driver) and workload steps.

Plain functions with ``configuration``/``secrets`` keyword arguments (Chaos Toolkit binds the
experiment's arguments against these signatures before anything runs). Every fault action
returns when the fault is in effect; every inverse is idempotent, so rollbacks can always run.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

from chaos.context import ChaosError, Context, utcnow
from platforms import PlatformError, SubmitRequest, Workload

__all__ = [
    "break_data_source",
    "crash_database_primary",
    "fail_over_database",
    "hang",
    "heal_agent",
    "heal_database",
    "heal_partitioned",
    "interrupt_pipeline_step",
    "kill",
    "kill_agent_during_checkpoint",
    "make_artifact_store_unreachable",
    "make_registry_unreachable",
    "partition_agent",
    "partition_agent_running",
    "partition_database",
    "replay_acknowledged",
    "replay_side_effect",
    "restore_all",
    "restore_artifact_store",
    "restore_clock",
    "restore_data_source",
    "restore_pool",
    "restore_registry",
    "restore_zone",
    "resume",
    "revoke_retired_credentials",
    "roll_release",
    "rotate_credentials",
    "send_late_reports",
    "skew_clock",
    "start",
    "stop",
    "stop_agents_in_region",
    "submit_pipeline",
    "submit_source_pipeline",
    "submit_workloads",
    "wait_for_operations",
    "wait_for_pipeline",
    "wait_for_progress",
    "wait_for_storage_pause",
    "withdraw_pool",
    "write_data_sources",
    "zone_outage",
]

# The actions that inject a fault (the others undo one or drive the workload): what
# `gameday run --dry-run` lists as hit. Each is in __all__ (tests/chaos/test_faults_marked.py).
FAULTS = (
    "break_data_source",
    "crash_database_primary",
    "fail_over_database",
    "hang",
    "interrupt_pipeline_step",
    "kill",
    "kill_agent_during_checkpoint",
    "make_artifact_store_unreachable",
    "make_registry_unreachable",
    "partition_agent",
    "partition_agent_running",
    "partition_database",
    "rotate_credentials",
    "roll_release",
    "send_late_reports",
    "skew_clock",
    "stop",
    "stop_agents_in_region",
    "withdraw_pool",
    "zone_outage",
)

Configuration = dict[str, Any] | None
Secrets = dict[str, Any] | None


def _ctx(configuration: Configuration) -> Context:
    return Context.from_configuration(configuration)


def _target(ctx: Context, target: str) -> str:
    """Logical targets ("api-replica") map to the platform's own component names."""
    return ctx.platform.fault_targets().get(target, target)


# -- faults ---------------------------------------------------------------------------------
def kill(target: str, configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """SIGKILL a component or one replica (``api-replica``, ``api-1``, ``cpu-1`` ...)."""
    ctx = _ctx(configuration)
    return ctx.driver.kill(_target(ctx, target))


def hang(target: str, configuration: Configuration = None, secrets: Secrets = None) -> dict:
    ctx = _ctx(configuration)
    return ctx.driver.hang(_target(ctx, target))


def resume(target: str, configuration: Configuration = None, secrets: Secrets = None) -> dict:
    ctx = _ctx(configuration)
    return ctx.driver.resume(_target(ctx, target))


def stop(target: str, configuration: Configuration = None, secrets: Secrets = None) -> dict:
    ctx = _ctx(configuration)
    return ctx.driver.stop(_target(ctx, target))


def start(target: str, configuration: Configuration = None, secrets: Secrets = None) -> dict:
    ctx = _ctx(configuration)
    return ctx.driver.start(_target(ctx, target))


def _credential_driver(ctx: Context) -> Any:
    driver = ctx.driver
    if not hasattr(driver, "rotate_credentials"):
        raise ChaosError(f"the {driver.name} driver cannot rotate credentials (local "
                         "environment only)")
    return driver


ROTATED = "credentials-rotated"  # the experiment's scratch tag of a rotation it made


def rotate_credentials(project: str | None = None, configuration: Configuration = None,
                       secrets: Secrets = None) -> dict:
    """Replace the agent token, a project's token (default: the last project by name, not
    the one the game day's load uses) and the database password while work runs; returns
    once every new credential is in place (ids only, never a secret)."""
    ctx = _ctx(configuration)
    out = _credential_driver(ctx).rotate_credentials(project)
    # what the refusal probe proves from now on (chaos/probes.py retired_credentials_refused)
    ctx.remember(ROTATED, [out.get("agent_token", {}).get("old")])
    return out


def revoke_retired_credentials(configuration: Configuration = None,
                               secrets: Secrets = None) -> dict:
    """Revoke the tokens the rotation retired (the old password died with ALTER ROLE)."""
    ctx = _ctx(configuration)
    return _credential_driver(ctx).revoke_retired_credentials()


def crash_database_primary(writable_within: float = 30.0, configuration: Configuration = None,
                           secrets: Secrets = None) -> dict:
    """SIGKILL the primary's postgres processes (a crash Patroni sees) and return once a new
    primary accepts writes, with the measured time."""
    ctx = _ctx(configuration)
    started = time.monotonic()
    out = ctx.driver.kill("primary/postgres")
    seconds = ctx.env.wait_db_writable(writable_within)
    ctx.env.note("failover", {"automation": "failover", "writable_after_s": round(seconds, 3),
                              "killed": out.get("target")})
    return {**out, "writable_after_s": round(time.monotonic() - started, 3)}


def fail_over_database(configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Planned failover to the synchronous standby (an operator's switch)."""
    return _ctx(configuration).driver.failover_db()


def make_artifact_store_unreachable(configuration: Configuration = None,
                                    secrets: Secrets = None) -> dict:
    return _ctx(configuration).driver.artifact_store_unreachable()


def restore_artifact_store(configuration: Configuration = None, secrets: Secrets = None) -> dict:
    return _ctx(configuration).driver.artifact_store_restore()


def make_registry_unreachable(configuration: Configuration = None,
                              secrets: Secrets = None) -> dict:
    return _ctx(configuration).driver.registry_unreachable()


def restore_registry(configuration: Configuration = None, secrets: Secrets = None) -> dict:
    return _ctx(configuration).driver.registry_restore()


def _pool(ctx: Context, pool: str) -> str:
    return ctx.platform.fault_targets().get(f"pool:{pool}", pool)


def withdraw_pool(pool: str, configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Every worker/agent of a capacity pool goes away (node group scaled to zero)."""
    ctx = _ctx(configuration)
    return ctx.driver.withdraw_pool(_pool(ctx, pool))


def restore_pool(pool: str, configuration: Configuration = None, secrets: Secrets = None) -> dict:
    ctx = _ctx(configuration)
    return ctx.driver.restore_pool(_pool(ctx, pool))


def partition_agent(agent: str, configuration: Configuration = None,
                    secrets: Secrets = None) -> dict:
    return _ctx(configuration).driver.partition_agent(agent)


def heal_agent(agent: str, configuration: Configuration = None, secrets: Secrets = None) -> dict:
    return _ctx(configuration).driver.heal_agent(agent)


def _clock_driver(ctx: Context) -> Any:
    if not hasattr(ctx.driver, "skew_clock"):
        raise ChaosError(f"the {ctx.driver.name} fault driver cannot skew a process's clock "
                         "(only the local environment's processes read an injectable clock)")
    return ctx.driver


def skew_clock(target: str, seconds: float, configuration: Configuration = None,
               secrets: Secrets = None) -> dict:
    """Step the wall clock of an agent (``cpu-1``) or of the ``reconciler`` ``seconds`` away
    from the true time: forward (> 0) or backward (< 0). Calling it again on the same target
    is a new jump from the true time, not a sum."""
    ctx = _ctx(configuration)
    return _clock_driver(ctx).skew_clock(_target(ctx, target), seconds)


def restore_clock(target: str, configuration: Configuration = None,
                  secrets: Secrets = None) -> dict:
    ctx = _ctx(configuration)
    return _clock_driver(ctx).restore_clock(_target(ctx, target))


def _running_agent(ctx: Context, op_id: str) -> str:
    view = ctx.platform.get(op_id, timeline=True)
    live = [a for a in view.attempts if a["state"] in ("dispatched", "running")]
    if not live:
        raise ChaosError(f"operation {op_id} has no live attempt (state {view.state})")
    return live[-1]["agent_name"]


def partition_agent_running(tag: str, configuration: Configuration = None,
                            secrets: Secrets = None) -> dict:
    """Cut off the agent that runs the first operation submitted under ``tag``."""
    ctx = _ctx(configuration)
    op_id = ctx.recall(tag)[0]
    agent = _running_agent(ctx, op_id)
    ctx.remember(f"{tag}:partitioned", [agent])
    return {"agent": agent, "operation_id": op_id, **ctx.driver.partition_agent(agent)}


def heal_partitioned(tag: str, configuration: Configuration = None,
                     secrets: Secrets = None) -> dict:
    """Heal the agent that ``partition_agent_running`` cut off for ``tag``."""
    ctx = _ctx(configuration)
    return {"healed": [ctx.driver.heal_agent(a)["target"] for a in ctx.recall(f"{tag}:partitioned")]}


def _object_keys(ctx: Context, prefix: str) -> set[str]:
    """Keys under ``prefix`` in the environment's artifact store (read directly, not through
    the fault proxy, so it works while the store's route is cut)."""
    from platforms.controlplane import s3_client

    eps = ctx.env.endpoints
    bucket = eps.get("bucket", "ml-artifacts")
    s3 = s3_client(eps.get("s3_direct") or eps.get("s3"), bucket, eps.get("region"))
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


def _torn_now(ctx: Context, prefix: str, settle: float = 0.3) -> set[str] | None:
    """The checkpoint's files once their listing has stopped growing, if its manifest is still
    missing (a write caught between its files and its manifest); None once the manifest exists."""
    seen: set[str] = set()
    while True:
        keys = _object_keys(ctx, prefix)
        if any(k.endswith("MANIFEST.json") for k in keys):
            return None
        if keys and keys == seen:
            return keys
        seen = keys
        time.sleep(settle)


def send_late_reports(tag: str, configuration: Configuration = None,
                      secrets: Secrets = None) -> dict:
    """The partitioned agent is back: its buffered events and its success arrive for the
    attempt whose lease it lost, with that attempt's (old) fencing token."""
    ctx = _ctx(configuration)
    view = ctx.platform.get(ctx.recall(tag)[0], timeline=True)
    lost = [a for a in view.attempts if a["state"] == "lost" and a.get("fencing_token")]
    if not lost:
        raise ChaosError(f"operation {view.id} has no lost attempt: the lease never moved")
    late = getattr(ctx.platform, "late_report", None)
    if late is None:
        raise ChaosError(f"platform {ctx.platform.name} has no fenced reports to replay")
    try:
        return {"attempts": [{"attempt_id": a["id"], **late(a)} for a in lost]}
    except PlatformError as exc:
        raise ChaosError(str(exc)) from None


def kill_agent_during_checkpoint(tag: str, after_step: int = 1, timeout: float = 60.0,
                                 configuration: Configuration = None,
                                 secrets: Secrets = None) -> dict:
    """SIGKILL the agent running the workload *inside* a checkpoint write: after the write's
    files reached the store and before its manifest did (the workload is submitted with a
    ``checkpoint_commit_delay`` that holds that window open). Timed on the workload's own
    ``checkpoint_started`` event. The node is frozen first (SIGSTOP, agent and workload), the
    store is checked while nothing can write, and only a torn write is killed; a write that
    committed meanwhile is thawed and the next checkpoint is tried. Verified again after the
    kill: the action fails unless the write is left torn, so a kill that landed outside a
    write can never be taken for a rehearsal of this failure class (a failed action fails the
    experiment)."""
    ctx = _ctx(configuration)
    op_id = ctx.recall(tag)[0]
    deadline = time.monotonic() + timeout
    tried: set[str] = set()
    while time.monotonic() < deadline:
        view = ctx.platform.get(op_id, timeline=True)
        started = [e for e in view.events if e["kind"] == "checkpoint_started"
                   and (e.get("data") or {}).get("step", 0) >= after_step
                   and (e.get("data") or {}).get("prefix") not in tried]
        if started:
            event = started[-1]
            prefix = str(event["data"]["prefix"]).rstrip("/") + "/"
            tried.add(event["data"]["prefix"])
            files = _torn_now(ctx, prefix)
            if files is None:
                continue  # this write committed before we looked: wait for the next one
            agent = _running_agent(ctx, op_id)
            ctx.driver.hang(agent)  # freeze the node mid-write: no race with the manifest
            time.sleep(0.5)  # a request already on the wire lands (or not) before we look
            if any(k.endswith("MANIFEST.json") for k in _object_keys(ctx, prefix)):
                ctx.driver.resume(agent)
                continue  # it committed after all: thaw and try the next checkpoint
            out = ctx.driver.kill(agent)
            killed_at = utcnow()
            time.sleep(1.0)  # the workload dies with its agent: nothing may commit afterwards
            left = _object_keys(ctx, prefix)
            if any(k.endswith("MANIFEST.json") for k in left):
                raise ChaosError(f"the kill of {agent} did not land inside the checkpoint write "
                                 f"of {prefix}: its manifest was written anyway")
            ctx.remember(f"{tag}:killed", [agent])
            ctx.env.note("torn_checkpoint_left", {"operation_id": op_id, "prefix": prefix,
                                                  "files": sorted(k[len(prefix):] for k in left),
                                                  "agent": agent})
            return {"agent": agent, "operation_id": op_id, "checkpoint_step": event["data"]["step"],
                    "checkpoint_event_at": event["time"], "killed_at": killed_at,
                    "torn_prefix": prefix, "torn_files": sorted(k[len(prefix):] for k in left),
                    **out}
        if view.terminal:
            raise ChaosError(f"operation {op_id} ended ({view.state}) before a checkpoint "
                             "write could be interrupted")
        time.sleep(0.05)
    raise ChaosError(f"no checkpoint write of {op_id} could be interrupted within {timeout}s")


def wait_for_progress(tag: str, min_step: int = 1, timeout: float = 60.0,
                      configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Return once every operation of ``tag`` reported training progress (at least
    ``min_step``): its workload is past its start-up and inside its run, so a fault injected
    now meets the run, not a process still importing its libraries."""
    ctx = _ctx(configuration)
    ids = ctx.recall(tag)
    deadline = time.monotonic() + timeout
    steps: dict[str, int] = {}
    while time.monotonic() < deadline:
        for op_id in ids:
            try:
                view = ctx.platform.get(op_id, timeline=True)
            except PlatformError:
                continue
            seen = [int((e.get("data") or {}).get("step") or 0) for e in view.events
                    if e["kind"] in ("progress", "checkpoint_started", "checkpoint_written")]
            steps[op_id] = max(seen, default=0)
        if len(steps) == len(ids) and min(steps.values()) >= min_step:
            return {"tag": tag, "steps": steps}
        time.sleep(0.25)
    raise ChaosError(f"operations of {tag!r} made no progress to step {min_step} within "
                     f"{timeout}s: {steps}")


def wait_for_storage_pause(tag: str, timeout: float = 10.0, configuration: Configuration = None,
                           secrets: Secrets = None) -> dict:
    """Return once a workload of ``tag`` reported that the object store is unavailable (its
    writes are paused): proof that the outage met real writes. Fails otherwise, so an outage
    that ended before anything was written is never taken for a rehearsal."""
    ctx = _ctx(configuration)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for op_id in ctx.recall(tag):
            try:
                view = ctx.platform.get(op_id, timeline=True)
            except PlatformError:
                continue
            hit = [e for e in view.events if (e.get("data") or {}).get("storage_unavailable")
                   or "storage unavailable" in str(e.get("reason") or e.get("message") or "")]
            if hit:
                return {"operation_id": op_id, "first_pause": hit[0].get("time")}
        time.sleep(0.5)
    raise ChaosError(f"no workload of {tag!r} met the outage within {timeout}s: the fault "
                     "did not reach a write (nothing to judge)")


def partition_database(target: str = "api-replica", configuration: Configuration = None,
                       secrets: Secrets = None) -> dict:
    """Cut one API replica (logical ``api-replica`` or a component name) off from the database
    while the other replicas keep it: a replica that is alive but cannot serve."""
    ctx = _ctx(configuration)
    return ctx.driver.partition_database(_target(ctx, target))


def heal_database(target: str = "api-replica", configuration: Configuration = None,
                  secrets: Secrets = None) -> dict:
    ctx = _ctx(configuration)
    return ctx.driver.heal_database(_target(ctx, target))


def stop_agents_in_region(region: str, pool: str | None = None,
                          configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Stop every agent of a region (optionally one pool): the region fails."""
    ctx = _ctx(configuration)
    agents = [a.name for a in ctx.env.agents if a.region == region and (pool is None or
                                                                         a.pool == pool)]
    if not agents:
        raise ChaosError(f"no agents in region {region!r}" + (f" pool {pool!r}" if pool else ""))
    return {"region": region, "stopped": [ctx.driver.stop(a)["target"] for a in agents]}


def roll_release(release: str, components: list[str] | None = None, migrate: bool = True,
                 configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Rolling upgrade (or rollback) of the control plane to ``release`` (``N`` or ``N+1``):
    the schema step, then each process one by one, each healthy before the next
    (environments/local/faults.py roll_release; docs/upgrades.md). ``restore_all`` undoes it."""
    ctx = _ctx(configuration)
    roll = getattr(ctx.driver, "roll_release", None)
    if roll is None:
        raise ChaosError(f"the {ctx.driver.name} driver cannot roll releases (local only)")
    return roll(release, components, migrate=migrate)


def restore_all(configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Undo every active fault (restart what was killed or stopped, heal routes) and wait until
    the environment is healthy again. Safe to call any number of times."""
    ctx = _ctx(configuration)
    restored = ctx.driver.restore_all()
    ctx.env.wait_healthy(list(ctx.env.components), 90.0)
    return {"restored": restored}


# -- workload -------------------------------------------------------------------------------
def submit_workloads(tag: str, count: int = 1, steps: int = 40, checkpoint_every: int = 10,
                     step_delay: float = 0.05, seed: int = 7, regions: list[str] | None = None,
                     dataset: str | None = None, accelerators: int = 0, max_retries: int = 3,
                     checkpoint_commit_delay: float = 0.0, checkpoint_upload_every: int = 1,
                     checkpoint_sync_delay: float = 0.0, tracking: bool = False,
                     wait_for: str | None = None,
                     timeout: float = 60.0, configuration: Configuration = None,
                     secrets: Secrets = None) -> dict:
    """Submit ``count`` sample training operations under ``tag`` (every acknowledgement goes to
    the run's ledger) and optionally wait until they all reach state ``wait_for``; ``tracking``:
    they log to the environment's tracking server too (the tracking-outage class)."""
    ctx = _ctx(configuration)
    w = Workload(steps=steps, checkpoint_every=checkpoint_every, step_delay=step_delay,
                 seed=seed, regions=tuple(regions) if regions else None, dataset=dataset,
                 accelerators=accelerators, max_retries=max_retries,
                 checkpoint_commit_delay=checkpoint_commit_delay,
                 checkpoint_upload_every=checkpoint_upload_every,
                 checkpoint_sync_delay=checkpoint_sync_delay, tracking=tracking,
                 name=f"{ctx.experiment}-{tag}"[:120],
                 queue="gpu" if accelerators else "default")
    ids, acks = [], []
    for _ in range(count):
        key = f"{ctx.experiment}-{tag}-{uuid.uuid4()}"
        ack = _submit_with_retry(ctx, SubmitRequest(w, key), deadline=time.monotonic() + timeout)
        ids.append(ack.operation_id)
        acks.append(ack)
    ctx.ledger(acks, f"experiment:{ctx.experiment}")
    ctx.remember(tag, ids)
    # what a client keeps to retry a request whose answer it never got: key and body
    ctx.remember(f"{tag}:requests", [{"key": a.idempotency_key, "operation_id": a.operation_id,
                                      "workload": dataclasses.asdict(w)} for a in acks])
    if wait_for:
        _wait(ctx, ids, {wait_for}, timeout)
    return {"tag": tag, "operation_ids": ids}


def replay_acknowledged(tag: str, timeout: float = 30.0, configuration: Configuration = None,
                        secrets: Secrets = None) -> dict:
    """Send every request of ``tag`` again with its own Idempotency-Key, as clients do whose
    answer was lost with the replica that had already committed it. Each acknowledgement goes to
    the ledger: the durability audit then shows whether a key ever named two operations."""
    ctx = _ctx(configuration)
    sent = ctx.recall(f"{tag}:requests")
    acks, changed = [], []
    for item in sent:
        wl = {k: (tuple(v) if isinstance(v, list) else v) for k, v in item["workload"].items()}
        req = SubmitRequest(Workload(**wl), item["key"])
        ack = _submit_with_retry(ctx, req, deadline=time.monotonic() + timeout)
        acks.append(ack)
        if ack.operation_id != item["operation_id"]:
            changed.append({"key": item["key"], "first": item["operation_id"],
                            "replayed": ack.operation_id})
    ctx.ledger(acks, f"replay:{ctx.experiment}")
    return {"tag": tag, "replayed": len(acks), "same_operation": len(acks) - len(changed),
            "new_operation": changed}


def _submit_with_retry(ctx: Context, req: SubmitRequest, deadline: float) -> Any:
    # like any well-behaved client: retry with the same key until acknowledged
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            return ctx.platform.submit(req)
        except PlatformError as exc:
            last = exc
            time.sleep(0.5)
    raise ChaosError(f"submission not acknowledged before the deadline: {last}")


def _wait(ctx: Context, ids: list[str], states: set[str], timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    seen: dict[str, str] = {}
    while time.monotonic() < deadline:
        for op_id in ids:
            if seen.get(op_id) not in states:
                try:
                    view = ctx.platform.get(op_id)
                except PlatformError:
                    continue  # API briefly away during a fault: keep polling
                seen[op_id] = view.state
                # a terminal state is final: waiting out the timeout could not change the outcome
                if view.terminal and view.state not in states:
                    raise ChaosError(f"operation {op_id} ended {view.state} "
                                     f"({view.state_reason or 'no reason given'}), not in "
                                     f"{sorted(states)}: {seen}")
        if all(seen.get(i) in states for i in ids):
            return seen
        time.sleep(0.25)
    raise ChaosError(f"operations not in {sorted(states)} within {timeout}s: {seen}")


def wait_for_operations(tag: str, states: list[str] | str = "succeeded", timeout: float = 120.0,
                        configuration: Configuration = None, secrets: Secrets = None) -> dict:
    ctx = _ctx(configuration)
    wanted = {states} if isinstance(states, str) else set(states)
    return {"tag": tag, "states": _wait(ctx, ctx.recall(tag), wanted, timeout)}


# -- zones ----------------------------------------------------------------------------------
def _zone(ctx: Context, zone: str) -> str:
    """Logical zones ("zone-a") map to the environment's own (an AWS availability zone)."""
    return ctx.platform.fault_targets().get(f"zone:{zone}", zone)


def _standby_zone(ctx: Context) -> str:
    """The zone of the synchronous standby (local environment: env.json zones + Patroni)."""
    roles = ctx.env.db.roles()
    standby = next((n for n, r in roles.items() if r == "sync_standby"), None)
    zone = ctx.env.zone_of(standby) if standby else None
    if zone is None:
        raise ChaosError(f"no zone holds a synchronous standby (roles {roles})")
    return zone


def zone_outage(zone: str, configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Everything in one zone at once: its API replica, database member, agents and its share
    of the network (one fault on the timeline, its parts listed). ``zone: standby`` is the
    zone of the database's synchronous standby (the primary survives)."""
    ctx = _ctx(configuration)
    if zone == "standby":
        zone = _standby_zone(ctx)
        ctx.remember("zone-outage:zone", [zone])
    out = ctx.driver.zone_outage(_zone(ctx, zone))
    if out.get("primary_lost"):
        ctx.env.note("failover", {"automation": "failover", "cause": f"zone_outage:{zone}"})
    return out


def restore_zone(zone: str, configuration: Configuration = None, secrets: Secrets = None) -> dict:
    ctx = _ctx(configuration)
    if zone == "standby":  # the zone zone_outage chose
        zone = ctx.recall("zone-outage:zone")[0]
    return ctx.driver.restore_zone(_zone(ctx, zone))


# -- pipelines (docs/CONTRACTS.md section 5; on Prefect: platforms/prefect_pipeline.py) ----
PIPELINE_DATASET = "churn-rows"


def _pipelines(ctx: Context) -> Any:
    p = ctx.platform
    if not hasattr(p, "submit_pipeline"):
        raise ChaosError(f"platform {ctx.platform_name} has no pipelines API (its adapter has no "
                         "submit_pipeline; controlplane and prefect have one)")
    return p


def _dataset_bytes(nonce: str, version: int) -> bytes:
    # unique per run: the project's cache outlives a run, a rerun must not hit the last one's
    return "".join(f"{nonce},row-{i},{(i * 7 + version) % 13}\n" for i in range(200)).encode()


def _submit_pipeline_acknowledged(ctx: Context, cp: Any, body: dict[str, Any],
                                  tag: str) -> dict[str, Any]:
    """Submit ``body`` under one idempotency key until the platform acknowledges it (30 s:
    the experiment may start while the platform is still recovering), remembered as ``tag``."""
    key = f"{ctx.experiment}-{tag}-{uuid.uuid4()}"
    deadline = time.monotonic() + 30
    while True:
        try:
            p = cp.submit_pipeline(body, key)
            break
        except PlatformError as exc:
            if time.monotonic() > deadline:
                raise ChaosError(f"pipeline {tag}: not acknowledged: {exc}") from None
            time.sleep(0.5)
    ctx.remember(tag, [p["id"]])
    return p


def _pipeline_body(image: str, name: str, dataset: dict[str, Any], min_candidates: int,
                   interrupted_steps: int) -> dict[str, Any]:
    def op(kind: str, params: dict[str, Any], max_retries: int = 2) -> dict[str, Any]:
        return {"workload": {"kind": kind, "image": image, "params": params},
                "max_retries": max_retries}
    evaluate = {"seconds": 0.1, **({"min_candidates": min_candidates} if min_candidates else {})}
    return {"name": name, "max_parallel_steps": 4, "labels": {"gameday": "pipeline-recovery"},
            "steps": [
                {"name": "prepare", "phase": "prepare", "datasets": [dataset],
                 "environment": {"python": "3.12"}, "operation": op("prepare", {"seconds": 0.2})},
                # the candidate the experiment interrupts: long enough to be killed mid-way
                {"name": "train-a", "phase": "train", "needs": ["prepare"],
                 "operation": op("train", {"steps": interrupted_steps, "checkpoint_every": 10,
                                           "seed": 1, "step_delay": 0.1}, max_retries=3)},
                {"name": "train-b", "phase": "train", "needs": ["prepare"],
                 "operation": op("train", {"steps": 20, "checkpoint_every": 10, "seed": 2,
                                           "step_delay": 0.02})},
                # a candidate that fails for good: the evaluation must name it as excluded
                {"name": "train-c", "phase": "train", "needs": ["prepare"],
                 "operation": op("fail", {"exit_code": 2, "seconds": 0.2}, max_retries=0)},
                {"name": "evaluate", "phase": "evaluate", "role": "aggregate",
                 "needs": ["train-a", "train-b", "train-c"],
                 "on_upstream_failure": {"policy": "continue-incomplete"},
                 "operation": op("evaluate", evaluate)},
                {"name": "register", "phase": "register", "role": "release",
                 "needs": ["evaluate"], "side_effect": {"kind": "model_registration"},
                 "operation": op("sleep", {"seconds": 0.1})},
            ]}


def submit_pipeline(tag: str, dataset_version: int = 1, min_candidates: int = 0,
                    interrupted_steps: int = 80, wait_for: list[str] | str | None = None,
                    timeout: float = 120.0, configuration: Configuration = None,
                    secrets: Secrets = None) -> dict:
    """Write the dataset's bytes (``dataset_version``) under the run's dataset name, submit the
    experiment's pipeline (prepare -> train-a, train-b, train-c -> evaluate -> register) under
    a new Idempotency-Key and remember it under ``tag``; optionally wait until it ends in one
    of ``wait_for``. Version 2 keeps the name and the uri and changes the bytes (the declared
    sha256 follows the bytes, as a user's would); ``min_candidates`` adds the evaluation check
    enough_candidates, which fails with fewer candidates scored."""
    ctx = _ctx(configuration)
    cp = _pipelines(ctx)
    try:
        nonce = ctx.recall("pipeline:nonce")[0]
    except ChaosError:
        nonce = uuid.uuid4().hex[:12]
        ctx.remember("pipeline:nonce", [nonce])
    data = _dataset_bytes(nonce, dataset_version)
    uri = f"datasets/{ctx.experiment}/{nonce}/rows.csv"
    try:
        cp.put_object(uri, data)
    except Exception as exc:
        raise ChaosError(f"dataset {uri}: could not be written: {exc}") from exc
    dataset = {"name": PIPELINE_DATASET, "uri": uri, "sha256": _sha256(data)}
    body = _pipeline_body(cp.pinned_image, f"{ctx.experiment}-{tag}", dataset, min_candidates,
                          interrupted_steps)
    p = _submit_pipeline_acknowledged(ctx, cp, body, tag)
    out = {"tag": tag, "pipeline_id": p["id"], "dataset_sha256": dataset["sha256"],
           "image": cp.pinned_image}
    if wait_for:
        out["pipeline"] = _pipeline_summary(_wait_pipeline(ctx, p["id"], wait_for, timeout))
    return out


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _pipeline_summary(p: dict[str, Any]) -> dict[str, Any]:
    return {"state": p["state"], "state_reason": p["state_reason"], "report": p["report"],
            "steps": {s["name"]: s["state"] for s in p["steps"]},
            "timing": (p.get("timing") or {}).get("phases")}


def _wait_pipeline(ctx: Context, pid: str, states: list[str] | str, timeout: float,
                   ) -> dict[str, Any]:
    wanted = {states} if isinstance(states, str) else set(states)
    deadline = time.monotonic() + timeout
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        try:
            last = _pipelines(ctx).pipeline(pid)
        except PlatformError:
            time.sleep(0.5)
            continue
        if last["state"] in wanted:
            return last
        # "running" is a pipeline's only state with a way out (controlplane.models.Pipeline; the
        # Prefect adapter maps every unfinished flow state to it): any other is its outcome,
        # which waiting out the timeout could not change (as _wait for operations)
        if last["state"] != "running":
            raise ChaosError(f"pipeline {pid} ended {last['state']} "
                             f"({last.get('state_reason') or 'no reason given'}), not in "
                             f"{sorted(wanted)}: {_pipeline_summary(last)}")
        time.sleep(0.5)
    raise ChaosError(f"pipeline {pid} not in {sorted(wanted)} within {timeout}s: "
                     f"{_pipeline_summary(last) if last else 'never read'}")


def wait_for_pipeline(tag: str, states: list[str] | str = "succeeded", timeout: float = 180.0,
                      configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Wait until the pipeline of ``tag`` ends in one of ``states``."""
    ctx = _ctx(configuration)
    return _pipeline_summary(_wait_pipeline(ctx, ctx.recall(tag)[0], states, timeout))


def _step(ctx: Context, tag: str, step: str) -> dict[str, Any]:
    p = _pipelines(ctx).pipeline(ctx.recall(tag)[0])
    return next(s for s in p["steps"] if s["name"] == step)


def interrupt_pipeline_step(tag: str, step: str, after_step: int = 20, timeout: float = 90.0,
                            configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """SIGKILL the agent running ``step`` of the pipeline of ``tag`` once its training reported
    progress past ``after_step`` (a checkpoint exists to resume from). The workload dies with
    its agent; the lease expires and the step's operation moves to a new attempt, which must
    resume from the checkpoint (restore_all restarts the agent)."""
    ctx = _ctx(configuration)
    deadline = time.monotonic() + timeout
    op_id: str | None = None
    while time.monotonic() < deadline:
        try:
            s = _step(ctx, tag, step)
        except PlatformError:
            time.sleep(0.25)
            continue
        op_id = s["operation_id"]
        if s["state"] not in ("waiting", "running"):
            raise ChaosError(f"step {step} ended ({s['state']}: {s['state_reason']}) before it "
                             "could be interrupted")
        if op_id:
            view = ctx.platform.get(op_id, timeline=True)
            reached = max((int((e.get("data") or {}).get("step") or 0) for e in view.events
                           if e["kind"] in ("progress", "checkpoint_written")), default=0)
            if reached >= after_step:
                agent = _running_agent(ctx, op_id)
                out = ctx.driver.kill(agent)
                ctx.remember(f"{tag}:killed", [agent])
                ctx.remember(f"{tag}:{step}", [op_id])
                return {"step": step, "operation_id": op_id, "agent": agent,
                        "progress_step": reached, "killed_at": utcnow(), **out}
        time.sleep(0.1)
    raise ChaosError(f"step {step} of {tag} did not reach training step {after_step} within "
                     f"{timeout}s (operation {op_id})")


def replay_side_effect(tag: str, step: str = "register", configuration: Configuration = None,
                       secrets: Secrets = None) -> dict:
    """Send the registration of ``step`` again exactly as its agent sent it (operation, action
    id, kind, payload): the retry of a client whose answer was lost. The platform must answer
    with the first receipt (created false), never record a second registration."""
    ctx = _ctx(configuration)
    s = _step(ctx, tag, step)
    if not s["operation_id"]:
        raise ChaosError(f"step {step} of {tag} has no operation ({s['state']})")
    result = ctx.platform.get(s["operation_id"]).result or {}
    effect = result.get("side_effect") or {}
    if not effect.get("action_id"):
        raise ChaosError(f"step {step} of {tag}: its result records no side effect")
    status, answer = _pipelines(ctx).record_side_effect(
        s["operation_id"], effect["action_id"], "model_registration",
        {"inputs": result.get("inputs") or []})
    return {"operation_id": s["operation_id"], "action_id": effect["action_id"],
            "first_receipt": effect.get("receipt"), "status": status,
            "created": answer.get("created"), "receipt": answer.get("receipt")}


# -- data at start: a step reading ten sources, one unavailable or corrupt ------------------
# (docs/CONTRACTS.md section 5, "Data at start"; slo/pipelines.py sources-accounted)
SOURCE_FAULT = "data_source_unavailable"  # the fault name slo/pipelines.py judges


def _source_bytes(nonce: str, tag: str, i: int) -> bytes:
    return "".join(f"{nonce},{tag},source-{i},row-{r},{(r * 7 + i) % 13}\n"
                   for r in range(20)).encode()


def write_data_sources(tag: str, count: int = 10, configuration: Configuration = None,
                       secrets: Secrets = None) -> dict:
    """Write ``count`` small sources (s00, s01, ...) to the object store under this run's prefix
    for ``tag`` and remember their declarations (name, sha256 of the bytes, uri): what a
    pipeline of ``tag`` will declare."""
    ctx = _ctx(configuration)
    cp = _pipelines(ctx)
    nonce = uuid.uuid4().hex[:12]
    declared = []
    for i in range(count):
        data = _source_bytes(nonce, tag, i)
        uri = f"datasets/{ctx.experiment}/{nonce}/{tag}/s{i:02d}.csv"
        try:
            cp.put_object(uri, data)
        except Exception as exc:
            raise ChaosError(f"source {uri}: could not be written: {exc}") from exc
        declared.append({"name": f"s{i:02d}", "uri": uri, "sha256": _sha256(data)})
    ctx.remember(f"{tag}:sources", declared)
    ctx.remember(f"{tag}:nonce", [nonce])
    return {"tag": tag, "sources": len(declared), "prefix": f"datasets/{ctx.experiment}/{nonce}/"
            f"{tag}/"}


def _source(ctx: Context, tag: str, source: str) -> dict[str, Any]:
    found = [d for d in ctx.recall(f"{tag}:sources") if d["name"] == source]
    if not found:
        raise ChaosError(f"no source {source!r} was written for {tag!r} (write_data_sources)")
    return dict(found[0])


def break_data_source(tag: str, source: str, mode: str = "corrupt",
                      configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Make one source of ``tag`` unusable behind its declaration: ``corrupt`` writes other
    bytes under its uri (a digest mismatch), ``missing`` deletes its object. Recorded on the
    fault timeline (``data_source_unavailable``, target: the uri) until restore_data_source."""
    if mode not in ("corrupt", "missing"):
        raise ChaosError(f"mode {mode!r}: expected corrupt or missing")
    ctx = _ctx(configuration)
    cp = _pipelines(ctx)
    begin = getattr(ctx.driver, "begin", None)
    if begin is None:
        raise ChaosError(f"the {ctx.driver.name} fault driver cannot record a data-source fault "
                         "on its timeline (no begin)")
    ds = _source(ctx, tag, source)
    details = {"tag": tag, "source": source, "uri": ds["uri"], "mode": mode,
               "declared_sha256": ds["sha256"]}
    if mode == "corrupt":
        bad = b"corrupted behind its name\n" + ds["sha256"].encode()
        details["corrupt_sha256"] = _sha256(bad)
        cp.put_object(ds["uri"], bad)
    else:
        delete = getattr(cp, "delete_object", None)
        if delete is None:
            raise ChaosError(f"platform {ctx.platform_name} cannot delete an object")
        delete(ds["uri"])
    begin(SOURCE_FAULT, ds["uri"], details)
    return {"started_at": utcnow(), **details}


def restore_data_source(tag: str, source: str, configuration: Configuration = None,
                        secrets: Secrets = None) -> dict:
    """Write the source's declared bytes back and end its fault (idempotent)."""
    ctx = _ctx(configuration)
    ds = _source(ctx, tag, source)
    nonce = ctx.recall(f"{tag}:nonce")[0]
    data = _source_bytes(nonce, tag, int(source[1:]))
    if _sha256(data) != ds["sha256"]:
        raise ChaosError(f"source {source} of {tag}: its declared bytes cannot be rebuilt")
    _pipelines(ctx).put_object(ds["uri"], data)
    end = getattr(ctx.driver, "end", None)
    ended = end(SOURCE_FAULT, ds["uri"], {"tag": tag, "source": source}) if end else None
    return {"tag": tag, "source": source, "restored": True, "fault_ended": ended is not None}


def submit_source_pipeline(tag: str, policy: str, min_sources: int | None = None,
                           wait_for: list[str] | str | None = None, timeout: float = 60.0,
                           configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Submit a pipeline whose prepare step reads the sources of ``tag`` under the declared
    ``policy`` (fail, or degrade with ``min_sources``), then a train step on what it
    prepared; optionally wait until it ends in one of ``wait_for``."""
    ctx = _ctx(configuration)
    cp = _pipelines(ctx)
    datasets = ctx.recall(f"{tag}:sources")
    rule: dict[str, Any] = {"policy": policy}
    if min_sources is not None:
        rule["min_sources"] = min_sources

    def op(kind: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"workload": {"kind": kind, "image": cp.pinned_image, "params": params},
                "max_retries": 1}

    body = {"name": f"{ctx.experiment}-{tag}", "max_parallel_steps": 2,
            "labels": {"gameday": ctx.experiment},
            "steps": [
                {"name": "prepare", "phase": "prepare", "datasets": datasets,
                 "on_source_unavailable": rule, "cache": False,
                 "operation": op("prepare", {"seconds": 0.1})},
                {"name": "train", "phase": "train", "needs": ["prepare"], "cache": False,
                 "operation": op("train", {"steps": 10, "checkpoint_every": 5, "seed": 3})},
            ]}
    p = _submit_pipeline_acknowledged(ctx, cp, body, tag)
    out: dict[str, Any] = {"tag": tag, "pipeline_id": p["id"], "policy": rule}
    if wait_for:
        out["pipeline"] = _pipeline_summary(_wait_pipeline(ctx, p["id"], wait_for, timeout))
    return out
