"""The local Prometheus scrapes the storage layer's faultfs mounts when the environment has
them (`env up --storage-faults`: their control ports serve /metrics), labelled by disk, and
has no such job without them."""

from __future__ import annotations

from pathlib import Path

from environments.local.configs import prometheus_cfg

BASE = {"prometheus": 1, "etcd_client": 2, "pg0_rest": 3, "pg1_rest": 4, "haproxy_stats": 5,
        "registry_debug": 6, "proxy_control": 7}


def _jobs(ports: dict[str, int]) -> dict[str, dict]:
    cfg = prometheus_cfg(Path("/tmp/x"), "local", ports, (), False, None)
    return {j["job_name"]: j for j in cfg["scrape_configs"]}


def test_faultfs_mounts_are_scraped_by_disk_only_when_there() -> None:
    assert "faultfs" not in _jobs(BASE)
    job = _jobs({**BASE, "disk0_control": 24100, "disk1_control": 24101})["faultfs"]
    assert job["static_configs"] == [
        {"targets": ["127.0.0.1:24100"], "labels": {"disk": "disk-0"}},
        {"targets": ["127.0.0.1:24101"], "labels": {"disk": "disk-1"}}]
