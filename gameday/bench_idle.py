"""`gameday bench idle`: what the local environment costs while nobody uses it.

CPU is read from /proc (user + system ticks of every process of the environment) over a
quiet window, per component and in total, as a share of one core; memory as PSS (shared
pages split between the processes that share them). Medians over rounds: the machine is noisy.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from environments.local import procs

OTHER = "(other processes of the environment)"


def core_percent(ticks: int, seconds: float, hz: int) -> float:
    """CPU ticks spent over `seconds` as a percentage of one core (100 = one core busy)."""
    if seconds <= 0 or hz <= 0:
        raise ValueError(f"need seconds > 0 and hz > 0, got {seconds}, {hz}")
    return 100.0 * ticks / hz / seconds


def spent(before: Mapping[int, int], after: Mapping[int, int]) -> int:
    """Ticks spent by the processes alive at both ends (one that started or ended inside the
    window is counted from what is known: after - 0 for new ones, nothing for gone ones)."""
    return sum(t - before.get(pid, 0) for pid, t in after.items() if t >= before.get(pid, 0))


def owners(components: Mapping[str, list[int]], everything: list[int]) -> dict[int, str]:
    """pid -> the component it belongs to; the environment's other processes in one bucket."""
    out = {pid: OTHER for pid in everything}
    for name, pids in components.items():
        out.update(dict.fromkeys(pids, name))
    return out


def ticks_of(pids: list[int]) -> dict[int, int]:
    """pid -> CPU ticks (user + system) of the processes still alive."""
    return {pid: t for pid in pids if (t := procs.cpu_ticks(pid)) is not None}


def measure_round(pids_of: Callable[[], dict[int, str]], seconds: float, hz: int
                  ) -> dict[str, float]:
    """% of one core per component over one window, and the total."""
    owner = pids_of()
    before = ticks_of(list(owner))
    t0 = time.monotonic()
    time.sleep(seconds)
    owner.update(pids_of())  # processes started inside the window count too
    after = ticks_of(list(owner))
    elapsed = time.monotonic() - t0
    by: dict[str, float] = {}
    for name in set(owner.values()):
        mine = [p for p, n in owner.items() if n == name]
        by[name] = core_percent(spent({p: before[p] for p in mine if p in before},
                                      {p: after[p] for p in mine if p in after}), elapsed, hz)
    by["total"] = sum(by.values())
    return by


@click.command("idle")
@click.option("--env", "name", default="local", show_default=True, help="Local environment name.")
@click.option("--home", type=click.Path(file_okay=False, path_type=Path),
              help="Directory holding .gameday/ [default: $GAMEDAY_HOME or the current directory].")
@click.option("--seconds", default=30.0, show_default=True, help="Length of each quiet window.")
@click.option("--rounds", default=3, show_default=True, help="Windows measured (median shown).")
@click.option("--settle", default=20.0, show_default=True,
              help="Seconds to wait first (after `up`, start-up work is still settling).")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the figures as JSON here.")
def idle_cmd(name: str, home: Path | None, seconds: float, rounds: int, settle: float,
             json_out: Path | None) -> None:
    """Idle CPU (% of one core, total and per component) and PSS of a local environment.

    Uses the environment if it is up; otherwise brings it up, measures, and brings it down
    again, purging it if this command created it (an environment with state keeps it).
    Nothing else should run on the machine meanwhile (the figures would include it
    nowhere, but the environment's own timers stretch under contention)."""
    def say(msg: str) -> None:
        click.echo(msg, err=True)

    figures = measure_idle(name, home, seconds=seconds, rounds=rounds, settle=settle, say=say)
    click.echo(json.dumps(figures, indent=2))
    if json_out:
        json_out.write_text(json.dumps(figures, indent=2))


def missing_parts(info: Mapping[str, Any]) -> list[str]:
    """What the environment described by ``info`` (its env.json) runs without, of the control
    plane and its agents: an idle figure without them would look better than the real one."""
    cp = info.get("controlplane") or {}
    if not cp.get("included"):
        return ["the control plane (API, reconciler)", "agents"]
    return [] if cp.get("agents") and info.get("agents") else ["agents"]


def measure_idle(name: str, home: Path | None, *, seconds: float, rounds: int, settle: float,
                 say: Callable[[str], None]) -> dict[str, Any]:
    """The idle figures of the local environment `name` (brought up and down if it is not up)."""
    from environments.local.env import LocalEnvironment

    env = LocalEnvironment(name, home)
    started_here = not env.is_running()
    # an environment this benchmark creates leaves nothing behind (as root its database lives
    # outside the home, in /var/lib/gameday); one that already had state keeps it
    created_here = started_here and not env.state_dir.exists()
    if started_here:
        say(f"environment {name!r} is not up: starting it (brought down again afterwards)")
        env.up(reporter=lambda m: say(f"  {m}"))
    try:
        def pids_of() -> dict[int, str]:
            comps = {c: env.component_pids(c) for c in env.components}
            return owners(comps, procs.marked_processes(env.state_dir))

        hz = os.sysconf("SC_CLK_TCK")
        say(f"settling {settle:.0f} s, then {rounds} quiet window(s) of {seconds:.0f} s")
        time.sleep(settle)
        results = []
        for i in range(rounds):
            results.append(measure_round(pids_of, seconds, hz))
            say(f"  round {i + 1}: {results[-1]['total']:.1f} % of one core")
        names = sorted({n for r in results for n in r} - {"total"})
        per = {n: statistics.median(r.get(n, 0.0) for r in results) for n in names}
        everything = procs.marked_processes(env.state_dir)
        missing = missing_parts(env.info or {})
        figures: dict[str, Any] = {
            "seconds_per_round": seconds,
            "rounds": rounds,
            # the figure is the whole environment's only when nothing is missing from it
            "whole_environment": not missing,
            "missing": missing,
            "idle_cpu_percent_of_one_core": statistics.median(r["total"] for r in results),
            "idle_cpu_percent_by_component": dict(sorted(per.items(), key=lambda kv: -kv[1])),
            "processes": len(everything),
            "pss_mib": round(procs.pss_kib(everything) / 1024, 1),
        }
    finally:
        if started_here:
            say(f"bringing environment {name!r} down" + (" and purging it" if created_here else ""))
            env.down(purge=created_here)
    for comp, pct in figures["idle_cpu_percent_by_component"].items():
        say(f"  {pct:5.1f} %  {comp}")
    say(f"idle: {figures['idle_cpu_percent_of_one_core']:.1f} % of one core (median of "
        f"{rounds} x {seconds:.0f} s), {figures['processes']} processes, "
        f"PSS {figures['pss_mib']} MiB" + (
            "" if figures["whole_environment"] else
            f"; NOT the whole environment: it runs without {', '.join(figures['missing'])}"))
    return figures
