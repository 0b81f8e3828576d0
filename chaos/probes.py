"""Chaos Toolkit probes: SLI-shaped questions about the platform, answered with booleans or
small values the steady-state hypothesis checks with a tolerance."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx

from chaos.actions import ROTATED
from chaos.context import ChaosError, Context, utcnow
from platforms import PlatformError, SubmitRequest, Workload

__all__ = [
    "api_ready",
    "attempts_bounded",
    "clock_skew_seen",
    "database_writable",
    "environment_healthy",
    "errors_kept",
    "never_ran_outside",
    "operations_blocked_with_reason",
    "operations_in_state",
    "pipelines_in_state",
    "resumed_with_identical_weights",
    "retired_credentials_refused",
    "single_terminal_attempt",
    "sources_as_declared",
    "stale_report_refused",
    "step_resumed_from_checkpoint",
    "store_and_artifacts_reconciled",
    "submission_acknowledged",
    "tracking_server_ready",
]

Configuration = dict[str, Any] | None
Secrets = dict[str, Any] | None


def _ctx(configuration: Configuration) -> Context:
    return Context.from_configuration(configuration)


def api_ready(configuration: Configuration = None, secrets: Secrets = None) -> bool:
    """The platform answers through its load balancer and can reach its database."""
    return _ctx(configuration).platform.healthy()[0]


def submission_acknowledged(timeout: float = 10.0, configuration: Configuration = None,
                            secrets: Secrets = None) -> bool:
    """A small submission is acknowledged within ``timeout`` (retrying with its key)."""
    ctx = _ctx(configuration)
    key = f"{ctx.experiment}-probe-{uuid.uuid4()}"
    w = Workload(steps=2, checkpoint_every=1, step_delay=0.0, name=f"{ctx.experiment}-probe")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ack = ctx.platform.submit(SubmitRequest(w, key))
        except PlatformError:
            time.sleep(0.2)
            continue
        ctx.ledger([ack], f"probe:{ctx.experiment}")
        return True
    return False


def database_writable(configuration: Configuration = None, secrets: Secrets = None) -> bool:
    return bool(_ctx(configuration).env.db_writable())


def tracking_server_ready(timeout: float = 60.0, configuration: Configuration = None,
                          secrets: Secrets = None) -> bool:
    """The environment's tracking server (endpoint ``mlflow``) answers its health check within
    ``timeout`` s; False without one (`gameday env up --tracking`)."""
    url = _ctx(configuration).env.endpoints.get("mlflow")
    if not url:
        return False
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def environment_healthy(configuration: Configuration = None, secrets: Secrets = None) -> bool:
    """Every component healthy and no fault active: the only state worth injecting into."""
    status = _ctx(configuration).env.status()
    return bool(status["healthy"]) and not status.get("active_faults")


def _views(ctx: Context, tag: str, timeline: bool = False) -> list[Any]:
    """The operations this experiment submitted under ``tag``; none before the method ran, so
    tag probes are vacuously true in the steady-state check *before* the method."""
    try:
        ids = ctx.recall(tag)
    except ChaosError:
        return []
    return [ctx.platform.get(i, timeline=timeline) for i in ids]


def operations_in_state(tag: str, states: list[str] | str = "succeeded", within: float = 0.0,
                        configuration: Configuration = None, secrets: Secrets = None) -> bool:
    """Every operation of ``tag`` is in one of ``states`` (waiting up to ``within`` s)."""
    ctx = _ctx(configuration)
    wanted = {states} if isinstance(states, str) else set(states)
    deadline = time.monotonic() + within
    while True:
        try:
            if all(v.state in wanted for v in _views(ctx, tag)):
                return True
        except PlatformError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)


def operations_blocked_with_reason(tag: str, reason_contains: str = "",
                                   configuration: Configuration = None,
                                   secrets: Secrets = None) -> bool:
    """Waiting work says why: blocked/queued with a pending reason (and the expected words)."""
    for v in _views(_ctx(configuration), tag):
        if v.state not in ("blocked", "queued") or not v.pending_reason:
            return False
        if reason_contains and reason_contains not in (v.state_reason or ""):
            return False
    return True


def never_ran_outside(tag: str, regions: list[str], configuration: Configuration = None,
                      secrets: Secrets = None) -> bool:
    """No attempt of ``tag`` was ever dispatched to an agent outside ``regions``."""
    ctx = _ctx(configuration)
    allowed = {a.name for a in ctx.env.agents if a.region in regions}
    return all(a["agent_name"] in allowed for v in _views(ctx, tag, True) for a in v.attempts)


def single_terminal_attempt(tag: str, configuration: Configuration = None,
                            secrets: Secrets = None) -> bool:
    """Each succeeded operation has exactly one succeeded attempt and no live attempt."""
    for v in _views(_ctx(configuration), tag, timeline=True):
        states = [a["state"] for a in v.attempts]
        if v.state == "succeeded" and states.count("succeeded") != 1:
            return False
        if v.terminal and any(s in ("dispatched", "running") for s in states):
            return False
    return True


def stale_report_refused(tag: str, configuration: Configuration = None,
                         secrets: Secrets = None) -> dict:
    """Fencing held: the lost attempt's late reports (sent by ``send_late_reports`` and by the
    agent itself once healed) were refused, and the control plane recorded each refusal."""
    views = _views(_ctx(configuration), tag, True)
    if not views:
        return {"refused": True, "note": "nothing submitted yet"}
    view = views[0]
    lost = {a["id"] for a in view.attempts if a["state"] == "lost"}
    if not lost:
        raise ChaosError(f"operation {view.id} has no lost attempt: the lease never moved")
    refusals = [e for e in view.events
                if e["kind"] == "stale_report_refused" and e.get("attempt_id") in lost]
    return {"refused": bool(refusals), "refusals": len(refusals), "lost_attempts": sorted(lost)}


def clock_skew_seen(tag: str, min_seconds: float, configuration: Configuration = None,
                    secrets: Secrets = None) -> dict:
    """The skewed clocks reached the code that reads them: some claim of ``tag``'s operations
    recorded an agent clock at least ``min_seconds`` off the control plane's (the offset the
    API records on each claim event). Proof that the rehearsal ran with a skewed agent, not
    with a fault file nobody read."""
    views = _views(_ctx(configuration), tag, True)
    if not views:
        return {"seen": True, "note": "nothing submitted yet"}
    offsets = [float((e.get("data") or {})["agent_clock_offset"]) for v in views
               for e in v.events if e["kind"] == "claimed"
               and isinstance((e.get("data") or {}).get("agent_clock_offset"), (int, float))]
    return {"seen": any(abs(o) >= min_seconds for o in offsets), "claim_offsets": offsets}


def retired_credentials_refused(within: float = 15.0, configuration: Configuration = None,
                                secrets: Secrets = None) -> dict:
    """Every credential a rotation retired is refused (each API replica answers 401 to the
    old agent and project tokens; the old database password fails to log in) and every
    current one works. Before any rotation there is nothing to prove (vacuously true, like the
    tag probes). ``within``: how long a replica may still trust a revoked token (its token
    cache).

    Only a rotation of this experiment counts: a previous game day's retired credentials were
    that game day's to prove, and checking them before this method made a platform that
    accepts one again unmeasurable (steady state not met, exit 1) instead of failing the
    retired-credentials-refused objective on this rotation (exit 2)."""
    ctx = _ctx(configuration)
    driver = ctx.driver
    if not hasattr(driver, "retired_credentials_refused"):
        raise ChaosError(f"the {driver.name} driver cannot rotate credentials")
    try:
        ctx.recall(ROTATED)
    except ChaosError:
        return {"refused": True, "note": "nothing was rotated in this experiment yet"}
    return driver.retired_credentials_refused(within)


def attempts_bounded(tag: str, max_attempts: int, configuration: Configuration = None,
                     secrets: Secrets = None) -> bool:
    """No retry storm: at most ``max_attempts`` attempts per operation."""
    return all(len(v.attempts) <= max_attempts
               for v in _views(_ctx(configuration), tag, timeline=True))


def errors_kept(tag: str, contains: str, configuration: Configuration = None,
                secrets: Secrets = None) -> bool:
    """The original error (e.g. ``registry_unreachable``) is kept on the operation."""
    return all(contains in (v.state_reason or "") or any(
        contains in str(a.get("error") or "") for a in v.attempts)
        for v in _views(_ctx(configuration), tag, timeline=True))


def resumed_with_identical_weights(tag: str, reference_tag: str,
                                   configuration: Configuration = None,
                                   secrets: Secrets = None) -> dict:
    """The interrupted run resumed from a checkpoint and its final weights equal the
    uninterrupted reference run's (same seed): bit-identical, by sha256."""
    ctx = _ctx(configuration)
    runs, refs = _views(ctx, tag), _views(ctx, reference_tag)
    if not runs or not refs:
        return {"identical": True, "note": "nothing submitted yet"}
    run, ref = runs[0], refs[0]
    if run.state != "succeeded" or ref.state != "succeeded":
        raise ChaosError(f"not both succeeded: {run.state}, reference {ref.state}")
    a, b = run.result or {}, ref.result or {}
    return {"identical": a.get("weights_sha256") == b.get("weights_sha256") is not None,
            "resumed_from_step": a.get("resumed_from_step"),
            "torn_checkpoints_skipped": a.get("torn_checkpoints_skipped"),
            "weights_sha256": a.get("weights_sha256"), "checked_at": utcnow()}


def store_and_artifacts_reconciled(configuration: Configuration = None,
                                   secrets: Secrets = None) -> dict:
    """Reconciliation of operations vs artifacts (the step after a database restore or
    failover): every succeeded operation has its completion manifest and every completion
    manifest belongs to an operation the store knows."""
    platform = _ctx(configuration).platform
    reconcile = getattr(platform, "reconcile_artifacts", None)
    if reconcile is None:
        return {"consistent": True, "note": f"{platform.name} has no artifact reconciliation"}
    return reconcile()


def pipelines_in_state(tag: str, states: list[str] | str = "succeeded",
                       configuration: Configuration = None, secrets: Secrets = None) -> bool:
    """The pipeline of ``tag`` is in one of ``states``; vacuously true before the method
    submitted it (platforms with a pipelines API)."""
    ctx = _ctx(configuration)
    wanted = {states} if isinstance(states, str) else set(states)
    try:
        ids = ctx.recall(tag)
    except ChaosError:
        return True
    try:
        return all(ctx.platform.pipeline(i)["state"] in wanted  # type: ignore[attr-defined]
                   for i in ids)
    except PlatformError:
        return False


def step_resumed_from_checkpoint(tag: str, step: str, configuration: Configuration = None,
                                 secrets: Secrets = None) -> dict:
    """The interrupted step's operation (remembered as ``tag:step`` by interrupt_pipeline_step)
    ran a later attempt that resumed from a checkpoint past step 0. ``resumed`` is True before
    the method (nothing interrupted yet)."""
    ctx = _ctx(configuration)
    try:
        op_id = ctx.recall(f"{tag}:{step}")[0]
    except ChaosError:
        return {"resumed": True, "before_method": True}
    view = ctx.platform.get(op_id, timeline=True)
    steps = [int((e.get("data") or {}).get("from_step") or 0) for e in view.events
             if e["kind"] == "resumed"]
    return {"resumed": bool(steps) and max(steps) > 0 and view.state == "succeeded",
            "from_steps": steps, "attempts": len(view.attempts), "state": view.state}


def sources_as_declared(tag: str, source: str, expect: str, configuration: Configuration = None,
                        secrets: Secrets = None) -> dict:
    """The pipeline of ``tag`` did with its broken ``source`` what its policy declares:
    ``expect: degraded``: it succeeded and its report names the source as left out (its
    prepare step's manifest too); ``expect: failed``: it failed and its prepare step's reason
    names the source. ``as_declared`` is True before the method submitted it."""
    ctx = _ctx(configuration)
    try:
        pid = ctx.recall(tag)[0]
    except ChaosError:
        return {"as_declared": True, "before_method": True}
    try:
        p = ctx.platform.pipeline(pid)  # type: ignore[attr-defined]
    except PlatformError as exc:
        return {"as_declared": False, "error": str(exc)[:300]}
    prep = next((st for st in p["steps"] if st["name"] == "prepare"), {})
    named = ((p.get("report") or {}).get("excluded_sources") or {}).get("prepare") or {}
    in_manifest = (((prep.get("manifest") or {}).get("sources") or {}).get("excluded") or {})
    reason = prep.get("state_reason") or ""
    if expect == "degraded":
        ok = p["state"] == "succeeded" and source in named and source in in_manifest
    elif expect == "failed":
        ok = p["state"] == "failed" and prep.get("state") == "failed" and source in reason
    else:
        raise ChaosError(f"expect {expect!r}: degraded or failed")
    return {"as_declared": ok, "state": p["state"], "state_reason": p.get("state_reason"),
            "excluded_sources": named, "prepare": {"state": prep.get("state"),
                                                    "state_reason": reason[:400]}}
