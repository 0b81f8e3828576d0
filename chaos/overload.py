"""Chaos Toolkit actions for the overload class: offered load stepped to a share of the
capacity measured at the start of the experiment, held while a trigger comes and goes, then
removed.

The capacity is measured by the experiment itself, through the load balancer the users
reach (``endpoints.api``): a short closed-loop probe of submissions (loadtests/overload.py
``probe_capacity``), under the background load that is running anyway. ``capacity_per_s``
gives it instead (for instance the figure `gameday bench` measured, which is one API replica
on a private database: not this environment's capacity).

The load runs in a background thread of the Chaos Toolkit process between `start_overload`
and `stop_overload` (in the rollbacks too, so a failed method never leaves it running). Its
records go where the background load's go: every HTTP attempt to a part file of the load's
requests (merged into requests.jsonl when the load stops, loadtests/collect.py), every
acknowledgement to the client ledger. The step up and down are notes on the fault timeline;
the trigger (a toxic on the database route) is the experiment's fault.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from chaos.context import ChaosError, Context
from loadtests.overload import OpenLoop, cancel_held, first_project, offered_rate, probe_capacity

__all__ = ["start_overload", "stop_overload"]

# The actions that inject a fault, as in chaos/actions.py (what `gameday run --dry-run` lists):
# the load step is what the platform is hit with, though the trigger is the recorded fault
FAULTS = ("start_overload",)

Configuration = dict[str, Any] | None
Secrets = dict[str, Any] | None

# the open loop of each experiment of this process (one Chaos Toolkit run = one process)
_RUNNING: dict[str, OpenLoop] = {}


def _target(ctx: Context) -> tuple[str, str, str]:
    """(API URL, a project's user token, that project) of the environment."""
    first = first_project(ctx.env.tokens)
    if first is None:
        raise ChaosError("the environment has no project token (env.json: tokens.projects)")
    project, token = first
    return str(ctx.env.endpoints["api"]), token, project


def _state(ctx: Context, update: dict[str, Any]) -> dict[str, Any]:
    path = ctx.run_dir / "experiments" / ctx.experiment / "overload.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc.update(update)
    path.write_text(json.dumps(doc, indent=2))
    return doc


def start_overload(share: float = 0.8, capacity_per_s: float | None = None,
                   probe_seconds: float = 5.0, probe_concurrency: int = 32,
                   request_timeout_s: float = 5.0, configuration: Configuration = None,
                   secrets: Secrets = None) -> dict:
    """Measure the capacity (unless given), then submit at ``share`` of it, open loop, until
    `stop_overload`. Returns the capacity, how it was measured, and the rate offered."""
    ctx = Context.from_configuration(configuration)
    if ctx.experiment in _RUNNING and _RUNNING[ctx.experiment].running():
        raise ChaosError(f"an overload of {ctx.experiment} is already running")
    url, token, project = _target(ctx)
    if capacity_per_s is None:
        acked, seconds = asyncio.run(probe_capacity(url, token, probe_seconds, probe_concurrency))
        if not acked:
            raise ChaosError(f"capacity probe: no submission acknowledged in {seconds:.1f} s "
                             f"({probe_concurrency} closed-loop clients on {url})")
        capacity, basis = acked / seconds, (f"closed loop, {probe_concurrency} clients, "
                                            f"{seconds:.1f} s: {acked} acknowledged")
    else:
        capacity, basis = float(capacity_per_s), "given"
    rate = offered_rate(capacity, share)
    parts = ctx.run_dir / ".locust" / "parts"  # merged with the background load's parts
    loop = OpenLoop(url=url, token=token, rate=rate, project=project,
                    requests_path=parts / f"requests.overload-{ctx.experiment}.jsonl",
                    ledger_path=parts / f"ledger.overload-{ctx.experiment}.jsonl",
                    source=f"experiment:{ctx.experiment}", request_timeout_s=request_timeout_s)
    loop.start()
    _RUNNING[ctx.experiment] = loop
    details = {"capacity_per_s": round(capacity, 1), "capacity_basis": basis, "share": share,
               "rate_per_s": round(rate, 1), "request_timeout_s": request_timeout_s}
    ctx.env.note("overload started", {"experiment": ctx.experiment, **details})
    _state(ctx, details)
    return details


def stop_overload(configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Stop the experiment's open loop (idempotent: nothing running is not an error) and
    record what it sent."""
    ctx = Context.from_configuration(configuration)
    loop = _RUNNING.pop(ctx.experiment, None)
    if loop is None:
        return {"running": False}
    counts = loop.stop()
    # its submissions went to the held queue: canceled now, so that no later experiment
    # carries tens of thousands of waiting operations (they stay in the store for the audit)
    counts.update(cancel_held(ctx.platform))
    ctx.env.note("overload stopped", {"experiment": ctx.experiment, **counts})
    _state(ctx, {"counts": counts})
    if "error" in counts:
        raise ChaosError(f"the overload load failed: {counts['error']}")
    return counts
