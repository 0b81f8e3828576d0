"""Gray network faults on the real local environment: toxics on the fault proxy's routes,
through the CLI, each start / change / end on the fault timeline, undone by restore-all."""

from __future__ import annotations

import json
import statistics
import time

import httpx
import pytest
from click.testing import CliRunner

from environments.local.cli import fault_group
from environments.local.env import LocalEnvironment

pytestmark = pytest.mark.slow


def _cli(env: LocalEnvironment, *args: str) -> tuple[int, str]:
    home = str(env.state_dir.parents[2])
    r = CliRunner().invoke(fault_group, [*args, "--name", env.name, "--home", home])
    return r.exit_code, r.output


def _route_rtt_ms(env: LocalEnvironment, agent: str, n: int = 5) -> float:
    """Median time of a /healthz round trip through an agent's route to the API."""
    port = env.components[agent].ports["api_route"]
    took = []
    with httpx.Client(timeout=5.0) as client:
        for _ in range(n):
            started = time.monotonic()
            assert client.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
            took.append((time.monotonic() - started) * 1000)
    return statistics.median(took)


def test_a_toxic_on_the_agents_group_slows_every_agent_route_and_is_recorded(
        env: LocalEnvironment) -> None:
    agents = [a.name for a in env.agents]
    before = len(env.faults.timeline.read())
    code, out = _cli(env, "toxic-add", "agents", "--type", "latency", "--toxic", "slow",
                     "--attr", "latency=300")
    assert code == 0, out
    added = json.loads(out)
    assert added["routes"] == sorted(f"agent-{a}" for a in agents)
    assert all(_route_rtt_ms(env, a, 3) >= 250 for a in agents[:2])
    routes = json.loads(_cli(env, "routes")[1])
    assert [t["name"] for t in routes[f"agent-{agents[0]}"]["toxics"]] == ["slow"]
    assert routes["s3"]["toxics"] == []  # other routes untouched

    code, out = _cli(env, "toxic-change", "agents", "slow", "--attr", "latency=20")
    assert code == 0, out
    assert _route_rtt_ms(env, agents[0]) < 150  # in effect when the command returned
    assert _cli(env, "toxic-remove", "agents", "slow")[0] == 0
    assert _route_rtt_ms(env, agents[0]) < 100
    lines = env.faults.timeline.read()[before:]
    assert [(x["event"], x["fault"], x["target"]) for x in lines] == [
        ("fault_start", "network_gray", "agents/slow"), ("note", "network_gray", "agents/slow"),
        ("fault_end", "network_gray", "agents/slow")]
    assert lines[0]["details"]["toxic"]["attributes"]["latency"] == 300
    assert lines[1]["details"]["toxic"]["attributes"]["latency"] == 20


def test_a_bad_toxic_is_refused_naming_the_field_and_nothing_changes(
        env: LocalEnvironment) -> None:
    before = len(env.faults.timeline.read())
    code, out = _cli(env, "toxic-add", "agents", "--type", "bandwidth", "--attr", "rate=0")
    assert code == 1 and "attributes.rate" in out, out
    code, out = _cli(env, "toxic-add", "nowhere", "--type", "latency", "--attr", "latency=5")
    assert code == 1 and "unknown route or group 'nowhere'" in out, out
    assert len(env.faults.timeline.read()) == before
    assert all(r["toxics"] == [] for r in json.loads(_cli(env, "routes")[1]).values())


def test_restore_all_removes_every_toxic(env: LocalEnvironment) -> None:
    assert _cli(env, "toxic-add", "database", "--type", "timeout", "--stream", "upstream",
                "--toxicity", "0.5", "--attr", "timeout=0")[0] == 0
    assert _cli(env, "toxic-add", "s3", "--type", "bandwidth", "--attr", "rate=64")[0] == 0
    assert len([k for k in env.faults.active() if k.startswith("network_gray:")]) == 2
    restored = env.faults.restore_all()
    assert sorted(restored) == ["network_gray:database/timeout_upstream",
                                "network_gray:s3/bandwidth_downstream"]
    assert all(r["toxics"] == [] for r in json.loads(_cli(env, "routes")[1]).values())
    assert env.faults.active() == {}


def test_cpu_starvation_of_a_component_through_the_cli(env: LocalEnvironment) -> None:
    """The reconciler's processes move into a limited cgroup and back; the timeline has both
    ends; a share out of range is refused by the CLI."""
    code, out = _cli(env, "cpu-starve", "reconciler", "--share", "0.05")
    if code == 1 and "needs a cgroup hierarchy" in out:
        pytest.skip(f"no cgroup CPU controller here: {out.strip()}")
    assert code == 0, out
    started = json.loads(out)
    group = env.faults.cpu.group("reconciler")
    inside = {int(p) for p in (group / "cgroup.procs").read_text().split()}
    assert set(started["pids"]) <= inside and env.main_pid("reconciler") in inside
    assert _cli(env, "cpu-restore", "reconciler")[0] == 0
    assert not group.exists()
    assert not [k for k in env.faults.active() if k.startswith("cpu_starvation:")]
    code, out = _cli(env, "cpu-starve", "reconciler", "--share", "2")
    assert code == 2 and "--share" in out


def test_memory_pressure_on_a_component_through_the_cli(env: LocalEnvironment) -> None:
    """The reconciler's processes move into a memory-limited cgroup (a limit it stays under:
    it keeps running) and back; the timeline has both ends; a limit out of range is refused."""
    code, out = _cli(env, "mem-squeeze", "reconciler", "--limit-mib", "512")
    if code == 1 and "needs a cgroup hierarchy" in out:
        pytest.skip(f"no cgroup memory controller here: {out.strip()}")
    assert code == 0, out
    started = json.loads(out)
    group = env.faults.memory.group("reconciler")
    limit = group / ("memory.limit_in_bytes" if (group / "memory.limit_in_bytes").exists()
                     else "memory.max")
    assert limit.read_text().strip() == str(512 * 1024 * 1024)
    inside = {int(p) for p in (group / "cgroup.procs").read_text().split()}
    assert set(started["pids"]) <= inside and env.main_pid("reconciler") in inside
    assert "memory_pressure:reconciler" in env.faults.active()
    assert _cli(env, "mem-release", "reconciler")[0] == 0
    assert not group.exists() and env.main_pid("reconciler")
    assert not [k for k in env.faults.active() if k.startswith("memory_pressure:")]
    timeline = [json.loads(x) for x in env.timeline_file.read_text().splitlines() if x]
    assert [t["event"] for t in timeline if t["fault"] == "memory_pressure"][-2:] == [
        "fault_start", "fault_end"]
    code, out = _cli(env, "mem-squeeze", "reconciler", "--limit-mib", "2")
    assert code == 2 and "--limit-mib" in out
