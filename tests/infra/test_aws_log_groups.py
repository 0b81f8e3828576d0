"""The log groups AWS would create by itself (EKS control-plane logs, RDS log exports) are
declared with retention, the stack's KMS key and the stack's tags (issue 49 item 5), so the
waste finder (tag filter project/stack) sees them and nothing keeps logs forever."""

from __future__ import annotations

import pytest

from provisioning.components.cluster import control_plane_log_group
from provisioning.components.database import rds_log_group
from provisioning.config import ConfigError
from tests.infra.harness import Run, run_program

STACKS = ("dev", "staging", "prod")


def _groups(run: Run) -> dict[str, dict]:
    return {r.props.get("name"): r.props for r in run.of_type("aws:cloudwatch/logGroup:LogGroup")}


def _expected(run: Run) -> list[str]:
    cluster = run.one("eks:index:Cluster").props
    db = run.one("aws:rds/instance:Instance").props
    assert cluster["enabledClusterLogTypes"] and db["enabledCloudwatchLogsExports"]
    return [control_plane_log_group(cluster["name"]),
            *(rds_log_group(db["identifier"], e) for e in db["enabledCloudwatchLogsExports"])]


@pytest.mark.parametrize("stack", STACKS)
def test_aws_written_log_groups_are_declared(runs: dict[str, Run], stack: str) -> None:
    run = runs[stack]
    groups = _groups(run)
    # the stack's data key, as on the flow logs
    key = next(p["kmsKeyId"] for n, p in groups.items() if n is None or "flow" in str(n))
    for name in _expected(run):
        assert name in groups, f"{name} is not declared"
        props = groups[name]
        assert props["retentionInDays"] in (30, 90), name
        assert props.get("kmsKeyId") == key, name
        tags = props["tags"]
        assert tags["project"] == "mlplatform" and tags["stack"] == stack, name
        assert tags["data-class"] == "telemetry", name
    assert key


def test_log_retention_is_configurable_and_checked() -> None:
    run = run_program("dev", patch={"mlplatform:cluster": {"logRetentionDays": 14},
                                    "mlplatform:database": {"logRetentionDays": 7}},
                      layers=("platform",))
    groups = _groups(run)
    assert groups[control_plane_log_group(run.one("eks:index:Cluster").props["name"])][
        "retentionInDays"] == 14
    db = run.one("aws:rds/instance:Instance").props["identifier"]
    assert groups[rds_log_group(db, "postgresql")]["retentionInDays"] == 7
    with pytest.raises(ConfigError, match=r"database\.logRetentionDays.*45 is not a retention"):
        run_program("dev", patch={"mlplatform:database": {"logRetentionDays": 45}},
                    layers=("platform",))
