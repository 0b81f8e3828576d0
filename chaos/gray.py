"""Chaos Toolkit actions for gray failures: slow, lossy, throttled and full, not only dead.

Network: toxics on the fault proxy's routes (environments/local/toxics.py: latency + jitter,
bandwidth, slicer, limit_data, reset_peer, timeout), per route or group of routes
(``agents``, ``database``, ``s3``, ``registry``), changeable while they are in effect.

CPU: a cgroup quota on one component's processes (environments/local/cpu_starvation.py). Memory: a
cgroup memory limit on them (environments/local/memory_pressure.py): page cache reclaimed, and an
allocation past the limit ends in the OOM killer inside the group.

Disk: a database member's disk slow (per-operation latency, fsync separately), full (ENOSPC)
or failing (EIO), optionally only for paths under its data directory matching a glob
(``pg_wal/**``), through the storage layer (environments/local/disk_faults.py; the environment must
run with it: `gameday env up --storage-faults`).

Power: an agent host loses power (environments/local/power_loss.py): the agent and its workloads
SIGKILLed, every write on the node's own disk (its checkpoint directory, environments/local/
node_disk.py) that was not fsynced dropped, the agent started again on the same disk; timed
inside a checkpoint write of the job, and failed unless the loss met it.

Object store: an S3 brownout (environments/local/s3_brownout.py: ``503 SlowDown`` or another 5xx
on a share of requests, latency, a bandwidth cap), changeable while in effect; its fault
records carry the request counts the retry-amplification invariant judges.

Each fault action returns when the fault is in effect and is recorded on the fault timeline;
each inverse is idempotent. The cloud driver injects network toxics on the agents' route to
the API as Chaos Mesh NetworkChaos objects (environments/cloud/network_chaos.py: latency, and full
silence; a toxic without an equivalent is refused before anything changes, naming its field);
the drivers that cannot inject a gray fault refuse with the reason; ``gameday validate`` checks every toxic of an experiment before
anything starts (``argument_problems`` below, called by chaos/validate.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from chaos.context import ChaosError, Context
from environments.local.memory_pressure import MAX_LIMIT_MIB, MIN_LIMIT_MIB
from environments.local.s3_brownout import BrownoutInvalid, parse_brownout
from environments.local.toxics import ToxicError, parse_toxic

__all__ = ["add_toxics", "change_s3_brownout", "change_toxic", "clear_disk", "end_s3_brownout",
           "fail_disk", "fill_disk", "power_loss_during_checkpoint", "release_memory",
           "remove_toxics", "restore_cpu", "slow_disk", "squeeze_memory", "start_s3_brownout",
           "starve_cpu"]

# The actions that inject a fault, as in chaos/actions.py (what `gameday run --dry-run` lists).
FAULTS = ("add_toxics", "change_s3_brownout", "start_s3_brownout", "starve_cpu", "squeeze_memory",
          "slow_disk", "fill_disk", "fail_disk", "power_loss_during_checkpoint")

Configuration = dict[str, Any] | None
Secrets = dict[str, Any] | None


# what each gray capability of a driver is, for the refusal of one that lacks it
CAPABILITIES = {
    "network": "inject gray network faults (toxics on the local fault proxy's routes, or Chaos "
               "Mesh NetworkChaos on a cloud stack's agents)",
    "store": "brown out the object store (the local environment's S3 server only)",
    "cpu": "starve a process of CPU (cgroup quotas on the local environment's processes only)",
    "memory": "put a process under memory pressure (cgroup memory limits on the local "
              "environment's processes only)",
    "disks": "inject storage faults (the local environment's storage layer only: gameday env "
             "up --storage-faults)",
    "power": "cut an agent host's power (a node disk of the local environment's storage "
             "layer only: gameday env up --storage-faults)",
}


def _part(configuration: Configuration, name: str) -> tuple[Any, Any]:
    """(driver, its fault part ``name``); ChaosError saying what it cannot do without one."""
    driver = Context.from_configuration(configuration).driver
    part = getattr(driver, name, None)
    if part is None:
        raise ChaosError(f"the {driver.name} fault driver cannot {CAPABILITIES[name]}")
    return driver, part


def _network(configuration: Configuration) -> Any:
    return _part(configuration, "network")[1]


def add_toxics(target: str, toxics: list[dict[str, Any]], hold_seconds: float | None = None,
               configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Add toxics (``[{name, type, stream, toxicity, attributes}]``) to every route of
    ``target``; all of them are in effect when this returns. A driver that can refuse a toxic
    it cannot express (``check``: the cloud driver) does so before any is added.

    ``hold_seconds``: keep them that long, then remove them, in this action. A short fault
    (a 2 s blackout against a 5 s lease) must last what the experiment says: held with a
    pause and removed by the next action, it also lasts the Chaos Toolkit's time between two
    activities, which on a busy 2-core machine was 1.7 s more (a 2 s blackout of 3.75 s, a
    lease lost by a healthy platform)."""
    network = _network(configuration)
    check = getattr(network, "check", None)
    if check is not None:
        check(target, toxics)
    added = []
    try:
        for toxic in toxics:
            added.append(network.add(target, toxic))
    except Exception:
        for done in added:  # nothing half-applied stays behind
            network.remove(target, done["toxic"]["name"])
        raise
    if hold_seconds is None:
        return {"target": target, "toxics": added}
    try:
        time.sleep(hold_seconds)
    finally:
        removed = [network.remove(target, done["toxic"]["name"]) for done in added]
    return {"target": target, "toxics": added, "held_seconds": hold_seconds, "removed": removed}


def change_toxic(target: str, name: str, toxicity: float | None = None,
                 attributes: dict[str, Any] | None = None, configuration: Configuration = None,
                 secrets: Secrets = None) -> dict:
    """Change an active toxic in place (open connections included)."""
    return _network(configuration).update(target, name, toxicity=toxicity, attributes=attributes)


def remove_toxics(target: str, names: list[str], configuration: Configuration = None,
                  secrets: Secrets = None) -> dict:
    network = _network(configuration)
    return {"target": target, "removed": [network.remove(target, n) for n in names]}


def _store(configuration: Configuration) -> Any:
    return _part(configuration, "store")[1]


def start_s3_brownout(brownout: dict[str, Any], baseline_seconds: float = 3.0,
                      configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Brown the S3 store out (``{error_rate, error_code, latency_ms, jitter_ms,
    bandwidth_kbps, methods, retry_after_s}``) after counting its requests for
    ``baseline_seconds``; in effect when this returns."""
    return _store(configuration).start(brownout, baseline_seconds=baseline_seconds)


def change_s3_brownout(brownout: dict[str, Any], configuration: Configuration = None,
                       secrets: Secrets = None) -> dict:
    """Replace the active brownout's settings (omitted fields back to their defaults)."""
    return _store(configuration).change(brownout)


def end_s3_brownout(configuration: Configuration = None, secrets: Secrets = None) -> dict:
    return _store(configuration).end()


def _cpu(configuration: Configuration) -> tuple[Any, Any]:
    return _part(configuration, "cpu")


def starve_cpu(target: str, share: float = 0.1, configuration: Configuration = None,
               secrets: Secrets = None) -> dict:
    """Limit every process of ``target`` (a component, or primary/standby) to ``share`` of
    one core: up and answering, slow."""
    driver, cpu = _cpu(configuration)
    return cpu.starve(driver.resolve(target)[0], share)


def restore_cpu(target: str, configuration: Configuration = None,
                secrets: Secrets = None) -> dict:
    driver, cpu = _cpu(configuration)
    return cpu.restore(driver.resolve(target)[0])


def squeeze_memory(target: str, limit_mib: float = 256, configuration: Configuration = None,
                   secrets: Secrets = None) -> dict:
    """Limit every process of ``target`` (a component, or primary/standby) to ``limit_mib``
    of memory in all: its page cache reclaimed, an allocation past the limit OOM-killed."""
    driver, memory = _part(configuration, "memory")
    return memory.squeeze(driver.resolve(target)[0], limit_mib)


def release_memory(target: str, configuration: Configuration = None,
                   secrets: Secrets = None) -> dict:
    driver, memory = _part(configuration, "memory")
    return memory.restore(driver.resolve(target)[0])


def _disks(configuration: Configuration) -> Any:
    return _part(configuration, "disks")[1]


def slow_disk(target: str, fsync_ms: float = 0, write_ms: float = 0, read_ms: float = 0,
              jitter_ms: float = 0, glob: str | None = None, configuration: Configuration = None,
              secrets: Secrets = None) -> dict:
    """Make ``target``'s disk (pg-0, pg-1, primary, standby) slow: each fsync, write, read
    matching ``glob`` (relative to the data directory; None: all) late by its delay."""
    return _disks(configuration).slow(target, fsync_ms=fsync_ms, write_ms=write_ms,
                                      read_ms=read_ms, jitter_ms=jitter_ms, glob=glob)


def fill_disk(target: str, glob: str | None = None, configuration: Configuration = None,
              secrets: Secrets = None) -> dict:
    """ENOSPC on every write, new file and extension matching ``glob``: a full disk."""
    return _disks(configuration).full(target, glob=glob)


def fail_disk(target: str, read: float = 0, write: float = 0, fsync: float = 0,
              glob: str | None = None, configuration: Configuration = None,
              secrets: Secrets = None) -> dict:
    """EIO with these probabilities per operation."""
    return _disks(configuration).errors(target, read=read, write=write, fsync=fsync, glob=glob)


def clear_disk(target: str | None = None, settle_seconds: float = 0.0,
               configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Healthy disks again (``target``'s, or every faulted one); with ``settle_seconds``,
    wait up to that long for a leader and a synchronous standby and record the cluster."""
    return _disks(configuration).clear(target, settle_seconds=settle_seconds)


def power_loss_during_checkpoint(tag: str, after_step: int = 1, settle: float = 0.5,
                                 timeout: float = 60.0, configuration: Configuration = None,
                                 secrets: Secrets = None) -> dict:
    """Cut the power of the host running the first operation of ``tag`` while it writes a
    checkpoint of step ``after_step`` or later to its node disk, ``settle`` seconds into the
    write (the job is submitted with a ``checkpoint_sync_delay`` longer than that: its first
    files are durable, its last is not); the agent comes back on the same disk. Fails unless
    the loss dropped bytes of that job's checkpoints, so a loss that met no write can never be
    taken for a rehearsal of this class."""
    _, power = _part(configuration, "power")
    ctx = Context.from_configuration(configuration)
    op_id = ctx.recall(tag)[0]
    view = ctx.platform.get(op_id, timeline=True)
    live = [a for a in view.attempts if a["state"] in ("dispatched", "running")]
    if not live:
        raise ChaosError(f"operation {op_id} has no live attempt (state {view.state})")
    agent = live[-1]["agent_name"]
    out = power.cut(agent, during_write_of=op_id, min_step=after_step, settle=settle,
                    timeout=timeout)
    if not out["landed_in_write"]:
        raise ChaosError(f"the power loss of {agent} dropped no checkpoint bytes of {op_id} "
                         f"(it dropped {out['crash'].get('dropped_bytes')} bytes elsewhere): "
                         "it did not meet a checkpoint write")
    ctx.remember(f"{tag}:power_lost", [agent])
    return {"agent": agent, "operation_id": op_id, **out}


# -- validation before anything runs (chaos/validate.py) -------------------------------------
def _toxics_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    toxics = arguments.get("toxics")
    if not isinstance(toxics, list) or not toxics:
        return [("toxics", "a non-empty list of toxics")]
    problems, names = [], set()
    hold = arguments.get("hold_seconds")
    if hold is not None and (isinstance(hold, bool) or not isinstance(hold, int | float)
                             or not 0 < hold <= 300):
        problems.append(("hold_seconds", f"a number of seconds above 0, at most 300, got {hold!r}"))
    for i, toxic in enumerate(toxics):
        try:
            parsed = parse_toxic(toxic, f"toxics[{i}]")
        except ToxicError as exc:  # "toxics[i].<field>: <reason>"
            path, _, reason = str(exc).partition(": ")
            problems.append((path, reason))
            continue
        if parsed.name in names:
            problems.append((f"toxics[{i}].name", f"{parsed.name!r} is used twice"))
        names.add(parsed.name)
    return problems


def _change_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    toxicity = arguments.get("toxicity")
    if toxicity is not None and (isinstance(toxicity, bool) or
                                 not isinstance(toxicity, int | float) or
                                 not 0 <= toxicity <= 1):
        return [("toxicity", f"a number from 0 to 1, got {toxicity!r}")]
    return []


def _brownout_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    try:
        parse_brownout(arguments.get("brownout"))
    except BrownoutInvalid as exc:
        return [(f"brownout.{exc.field}" if exc.field != "body" else "brownout", exc.reason)]
    seconds = arguments.get("baseline_seconds", 3.0)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds <= 60:
        return [("baseline_seconds", f"a number of seconds from 0 to 60, got {seconds!r}")]
    return []


def _share_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    share = arguments.get("share", 0.1)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0.01 <= share <= 1:
        return [("share", f"a fraction of one core from 0.01 to 1, got {share!r}")]
    return []


def _limit_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    limit = arguments.get("limit_mib", 256)
    if isinstance(limit, bool) or not isinstance(limit, int | float) or \
            not MIN_LIMIT_MIB <= limit <= MAX_LIMIT_MIB:
        reason = f"MiB of memory from {MIN_LIMIT_MIB} to {MAX_LIMIT_MIB}, got {limit!r}"
        return [("limit_mib", reason)]
    return []


def _target_problems(arguments: Mapping[str, Any], required: bool = True) -> list[tuple[str, str]]:
    target = arguments.get("target")
    if (target is None and not required) or (isinstance(target, str) and target.strip()):
        return []
    return [("target", f"a database member (pg-0, pg-1) or primary / standby, got {target!r}")]


def _disk_problems(mode: str) -> Callable[[Mapping[str, Any]], list[tuple[str, str]]]:
    from environments.local.disk_spec import params_of, problems

    def check(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
        params = {k: arguments[k] for k in params_of(mode) if k in arguments}
        return _target_problems(arguments) + problems(mode, params)
    return check


def _clear_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    seconds = arguments.get("settle_seconds", 0.0)
    out = _target_problems(arguments, required=False)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds <= 300:
        out.append(("settle_seconds", f"a number of seconds from 0 to 300, got {seconds!r}"))
    return out


def _power_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    step = arguments.get("after_step", 1)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        out.append(("after_step", f"a checkpoint step of 1 or more, got {step!r}"))
    for name, default, top in (("settle", 0.5, 30), ("timeout", 60.0, 600)):
        value = arguments.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= top:
            out.append((name, f"a number of seconds from 0 to {top}, got {value!r}"))
    return out


ARGUMENT_CHECKS: dict[str, Callable[[Mapping[str, Any]], list[tuple[str, str]]]] = {
    "power_loss_during_checkpoint": _power_problems,
    "add_toxics": _toxics_problems,
    "change_toxic": _change_problems,
    "start_s3_brownout": _brownout_problems,
    "change_s3_brownout": _brownout_problems,
    "starve_cpu": _share_problems,
    "squeeze_memory": _limit_problems,
    "slow_disk": _disk_problems("slow"),
    "fill_disk": _disk_problems("full"),
    "fail_disk": _disk_problems("errors"),
    "clear_disk": _clear_problems,
}


def argument_problems(func: str, arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(argument path or "", reason) for every bad parameter of a call to ``func``."""
    check = ARGUMENT_CHECKS.get(func)
    return check(arguments) if check else []
