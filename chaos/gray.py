"""Chaos Toolkit actions for gray failures: slow, lossy, throttled and full, not only dead.

Network: toxics on the fault proxy's routes (infra/local/toxics.py: latency + jitter,
bandwidth, slicer, limit_data, reset_peer, timeout), per route or group of routes
(``agents``, ``database``, ``s3``, ``registry``), changeable while they are in effect.

Object store: an S3 brownout (infra/local/s3_brownout.py: ``503 SlowDown`` or another 5xx
on a share of requests, latency, a bandwidth cap), changeable while in effect; its fault
records carry the request counts the retry-amplification invariant judges.

Each fault action returns when the fault is in effect and is recorded on the fault timeline;
each inverse is idempotent. The drivers that cannot inject a gray fault (the cloud driver so
far) refuse with the reason; ``gameday validate`` checks every toxic of an experiment before
anything starts (``argument_problems`` below, called by chaos/validate.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from chaos.context import ChaosError, Context
from infra.local.s3_brownout import BrownoutInvalid, parse_brownout
from infra.local.toxics import ToxicError, parse_toxic

__all__ = ["add_toxics", "change_s3_brownout", "change_toxic", "end_s3_brownout",
           "remove_toxics", "start_s3_brownout"]

# The actions that inject a fault, as in chaos/actions.py (what `gameday run --dry-run` lists).
FAULTS = ("add_toxics", "change_s3_brownout", "start_s3_brownout")

Configuration = dict[str, Any] | None
Secrets = dict[str, Any] | None


def _network(configuration: Configuration) -> Any:
    driver = Context.from_configuration(configuration).driver
    network = getattr(driver, "network", None)
    if network is None:
        raise ChaosError(f"the {driver.name} fault driver cannot inject gray network faults "
                         "(toxics on routes: the local environment's fault proxy only)")
    return network


def add_toxics(target: str, toxics: list[dict[str, Any]], configuration: Configuration = None,
               secrets: Secrets = None) -> dict:
    """Add toxics (``[{name, type, stream, toxicity, attributes}]``) to every route of
    ``target``; all of them are in effect when this returns."""
    network = _network(configuration)
    added = []
    try:
        for toxic in toxics:
            added.append(network.add(target, toxic))
    except Exception:
        for done in added:  # nothing half-applied stays behind
            network.remove(target, done["toxic"]["name"])
        raise
    return {"target": target, "toxics": added}


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
    driver = Context.from_configuration(configuration).driver
    store = getattr(driver, "store", None)
    if store is None:
        raise ChaosError(f"the {driver.name} fault driver cannot brown out the object store "
                         "(the local environment's S3 server only)")
    return store


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


# -- validation before anything runs (chaos/validate.py) -------------------------------------
def _toxics_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    toxics = arguments.get("toxics")
    if not isinstance(toxics, list) or not toxics:
        return [("toxics", "a non-empty list of toxics")]
    problems, names = [], set()
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


ARGUMENT_CHECKS: dict[str, Callable[[Mapping[str, Any]], list[tuple[str, str]]]] = {
    "add_toxics": _toxics_problems,
    "change_toxic": _change_problems,
    "start_s3_brownout": _brownout_problems,
    "change_s3_brownout": _brownout_problems,
}


def argument_problems(func: str, arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(argument path or "", reason) for every bad parameter of a call to ``func``."""
    check = ARGUMENT_CHECKS.get(func)
    return check(arguments) if check else []
