"""Zones of the local environment without starting it: what `up` records in env.json, the
clear error for an environment recorded before zones existed, and how zone_outage is undone
(restore_all, close_all)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from environments.local.bringup import label_zones
from environments.local.env import LocalEnvironment
from environments.local.errors import EnvError, UnknownTarget
from environments.local.spec import ComponentSpec, Group, HealthCheck
from environments.local.topology import API_ZONES, DB_ZONES, DEFAULT_AGENTS, zone_map


def _env(tmp_path: Path, info: dict[str, Any]) -> LocalEnvironment:
    state = tmp_path / ".gameday" / "envs" / "local"
    state.mkdir(parents=True)
    (state / "env.json").write_text(json.dumps({"components": {}, "agents": [], **info}))
    return LocalEnvironment("local", tmp_path)


def test_every_zone_has_an_api_replica_a_database_member_and_agents() -> None:
    zones = zone_map(DEFAULT_AGENTS)
    assert sorted(zones) == ["zone-a", "zone-b"]
    assert sorted(z["api"][0] for z in zones.values()) == sorted(API_ZONES)
    assert sorted(z["database"][0] for z in zones.values()) == sorted(DB_ZONES)
    assert zones["zone-a"]["agents"] == ["sys-1", "cpu-1", "gpu-2"]
    assert zones["zone-b"]["agents"] == ["cpu-2", "gpu-1"]
    assert zones["zone-a"]["routes"] == ["db-api-1", "agent-sys-1", "agent-cpu-1", "agent-gpu-2"]
    # the database members of both zones, never two in one: a zone loss leaves a standby
    assert all(len(z["database"]) == 1 for z in zones.values())


def test_up_labels_its_components_and_records_only_what_runs(tmp_path: Path) -> None:
    env = LocalEnvironment("local", tmp_path)
    env.components = {n: ComponentSpec(n, k, Group.CONTROLPLANE, [], HealthCheck("http://x"), {})
                      for n, k in (("api-2", "api"), ("pg-0", "patroni"), ("pg-1", "patroni"),
                                   ("cpu-2", "agent"))}
    agents = tuple(a for a in DEFAULT_AGENTS if a.name == "cpu-2")
    zones = label_zones(env.components, agents)
    assert zones["zone-a"] == {"api": [], "database": ["pg-0"], "agents": [], "routes": []}
    assert zones["zone-b"] == {"api": ["api-2"], "database": ["pg-1"], "agents": ["cpu-2"],
                               "routes": ["db-api-2", "agent-cpu-2"]}
    assert env.components["api-2"].labels["zone"] == "zone-b"
    assert env.components["pg-0"].labels["zone"] == "zone-a"


def test_an_environment_recorded_before_zones_gives_a_clear_error(tmp_path: Path) -> None:
    env = _env(tmp_path, {})
    with pytest.raises(EnvError, match=r"env\.json: no 'zones' field .*gameday env up"):
        env.zones()
    assert env.zone_of("api-1") is None  # status and the evidence keep working
    with pytest.raises(EnvError, match="no 'zones' field"):
        env.faults.zone_outage("zone-a")
    assert env.faults.active() == {} and not env.timeline_file.exists()


def test_an_unknown_zone_is_refused_by_name(tmp_path: Path) -> None:
    env = _env(tmp_path, {"zones": zone_map(DEFAULT_AGENTS)})
    assert env.zone_of("pg-1") == "zone-b" and env.zone_of("reconciler") is None
    with pytest.raises(UnknownTarget, match="unknown zone 'zone-c'; zones: zone-a, zone-b"):
        env.faults.zone_outage("zone-c")
    assert env.faults.active() == {}


def test_restore_all_brings_the_zone_back_and_close_all_heals_its_routes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _env(tmp_path, {"zones": zone_map(DEFAULT_AGENTS)})
    faults = env.faults
    parts = zone_map(DEFAULT_AGENTS)["zone-a"]
    faults.begin("zone_outage", "zone-a", {**parts, "mode": "blackhole"})
    restored: list[str] = []
    monkeypatch.setattr(faults.zones, "restore_zone",
                        lambda zone: restored.append(zone) or faults.end("zone_outage", zone, {}))
    assert faults.restore_all() == ["zone_outage:zone-a"] and restored == ["zone-a"]
    assert faults.active() == {}

    faults.begin("zone_outage", "zone-a", {**parts, "mode": "blackhole"})
    routes: list[tuple[str, str]] = []
    monkeypatch.setattr(faults.routes, "route", lambda route, mode: routes.append((route, mode)))
    assert faults.close_all("env down") == ["zone_outage:zone-a"]
    assert routes == [(r, "pass") for r in parts["routes"]]
    ends = [line for line in faults.timeline.read() if line["event"] == "fault_end"]
    assert ends[-1]["details"] == {"restored_by": "env down"}
