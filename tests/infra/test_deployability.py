"""Deployability checks (provisioning/deployability.py) on the mock-rendered program of every stack,
and one mutation per check: remove or break the thing it guards, the check must say so."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from provisioning import deployability as d
from provisioning.config import ConfigError
from tests.infra.harness import Resource, Run, run_program


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_every_stack_is_deployable_as_far_as_offline_checks_see(runs: dict[str, Run],
                                                                stack: str) -> None:
    findings = d.check_all(runs[stack].resources)
    assert findings == [], "\n".join(map(str, findings))


# --- mutations ----------------------------------------------------------------------------

def _without(resources: list[Resource], pred: Callable[[Resource], bool]) -> list[Resource]:
    kept = [r for r in resources if not pred(r)]
    assert len(kept) < len(resources), "the mutation removed nothing: it tests nothing"
    return kept


def _edit(resources: list[Resource], pred: Callable[[Resource], bool],
          change: Callable[[dict[str, Any]], None]) -> list[Resource]:
    out, hit = [], 0
    for r in resources:
        if pred(r):
            props = copy.deepcopy(r.props)
            change(props)
            r, hit = dataclasses.replace(r, props=props), hit + 1
        out.append(r)
    assert hit, "the mutation changed nothing: it tests nothing"
    return out


def _kind(kind: str, name: str = "") -> Callable[[Resource], bool]:
    return lambda r: r.props.get("kind") == kind and name in str(
        (r.props.get("metadata") or {}).get("name"))


def _checks(resources: list[Resource], check: str) -> list[str]:
    return [f.message for f in d.CHECKS[check](resources)]


def test_a_namespace_nobody_creates_is_found(runs: dict[str, Run]) -> None:
    res = _without(runs["dev"].resources, _kind("Namespace", "monitoring"))
    assert any("'monitoring'" in m for m in _checks(res, "namespaces"))
    res = _without(runs["dev"].resources, _kind("Namespace", "external-secrets"))
    assert any("'external-secrets'" in m for m in _checks(res, "namespaces"))


def test_a_secret_nobody_creates_is_found(runs: dict[str, Run]) -> None:
    res = _without(runs["dev"].resources, _kind("ExternalSecret", "agent-token"))
    found = _checks(res, "references")
    # both agent Deployments and the migrate Job use it
    assert len([m for m in found if "controlplane-agent-token" in m]) >= 3
    assert _checks(runs["dev"].resources, "references") == []
    res = _without(runs["dev"].resources, _kind("ServiceAccount", "migrate"))
    assert any("ServiceAccount mlp-controlplane/migrate" in m for m in _checks(res, "references"))


def test_rules_and_monitors_prometheus_would_not_load_are_found(runs: dict[str, Run]) -> None:
    base = runs["prod"].resources

    def relabel(props: dict[str, Any]) -> None:
        props["metadata"]["labels"]["release"] = "mlplatform-prod-obs-prometheus-stack"

    res = _edit(base, _kind("PrometheusRule"), relabel)
    assert any("does not select it" in m for m in _checks(res, "selectors"))
    res = _edit(base, _kind("ServiceMonitor"),
                lambda p: p["spec"]["selector"]["matchLabels"].update(
                    {"app.kubernetes.io/component": "apiserver"}))
    assert "ServiceMonitor selects no Service" in _checks(res, "selectors")
    res = _edit(base, _kind("PodMonitor"),
                lambda p: p["spec"]["podMetricsEndpoints"][0].update({"port": "metrics"}))
    assert any("no port named ['metrics']" in m for m in _checks(res, "selectors"))
    res = _edit(base, _kind("PodDisruptionBudget", "api"),
                lambda p: p["spec"]["selector"]["matchLabels"].update({"x": "y"}))
    assert "PDB selector matches no pod template" in _checks(res, "selectors")
    res = _without(base, lambda r: r.type == d.HELM_RELEASE)
    assert any("no Prometheus" in m for m in _checks(res, "selectors"))


def test_a_chart_needing_hooks_under_helm_v4_is_found(runs: dict[str, Run]) -> None:
    res = [dataclasses.replace(r, type=d.HELM_CHART) if r.type == d.HELM_RELEASE else r
           for r in runs["dev"].resources]
    assert any("kube-prometheus-stack" in m for m in _checks(res, "hooks"))


@pytest.mark.parametrize("what", [d.PUBLIC_ACCESS_BLOCK, d.BUCKET_ENCRYPTION])
def test_a_bucket_without_its_block_or_encryption_is_found(runs: dict[str, Run], what: str) -> None:
    base = runs["prod"].resources
    # the prod replica bucket only, then every bucket's
    res = _without(base, lambda r: r.type == what and "replica" in r.name)
    assert [f.resource for f in d.check_required(res)] == ["mlplatform-prod-artifacts-replica"]
    res = _without(base, lambda r: r.type == what)
    assert len(d.check_required(res)) == len([r for r in base if r.type == "aws:s3/bucket:Bucket"]) == 3
    res = _edit(base, lambda r: r.type == what and "replica" in r.name,
                lambda p: p.update({"restrictPublicBuckets": False}))
    if what == d.PUBLIC_ACCESS_BLOCK:
        assert "public-access block leaves a setting off" in _checks(res, "required")


def test_eks_without_secrets_encryption_is_found(runs: dict[str, Run]) -> None:
    res = _edit(runs["prod"].resources, lambda r: r.type == "eks:index:Cluster",
                lambda p: p.pop("encryptionConfigKeyArn"))
    assert any("KMS-encrypted" in m for m in _checks(res, "required"))


def test_a_device_plugin_that_does_not_tolerate_the_gpu_taint_is_found(runs: dict[str, Run]) -> None:
    res = _edit(runs["dev"].resources, _kind("DaemonSet", "nvidia-device-plugin"),
                lambda p: p["spec"]["template"]["spec"].update({"tolerations": []}))
    assert any("GPUs are never advertised" in m for m in _checks(res, "required"))


def test_capacity_without_an_autoscaler_is_found(runs: dict[str, Run]) -> None:
    res = _without(runs["dev"].resources,
                   lambda r: r.type in (d.HELM_CHART, d.HELM_RELEASE)
                   and str(r.props.get("chart", "")).rsplit("/", 1)[-1] in d.AUTOSCALER_CHARTS)
    assert any("autoscaler" in m for m in _checks(res, "required"))


def test_retention_cloudwatch_refuses_is_found_and_refused_in_config(runs: dict[str, Run]) -> None:
    res = _edit(runs["dev"].resources, lambda r: r.type == "aws:cloudwatch/logGroup:LogGroup",
                lambda p: p.update({"retentionInDays": 10}))
    assert any("retentionInDays 10" in m for m in _checks(res, "retention"))
    with pytest.raises(ConfigError, match=r"flowLogRetentionDays.*10 is not a retention"):
        run_program("dev", {"mlplatform:network": {"flowLogRetentionDays": 10}})


def test_an_alarm_missing_a_dimension_is_found(runs: dict[str, Run]) -> None:
    res = _edit(runs["prod"].resources,
                lambda r: r.type == "aws:cloudwatch/metricAlarm:MetricAlarm"
                and r.props.get("metricName") == "OperationsFailedReplication",
                lambda p: p["dimensions"].pop("DestinationBucket"))
    assert any("never fires" in m for m in _checks(res, "alarms"))
    replication = [r for r in runs["prod"].resources
                   if r.props.get("metricName") == "OperationsFailedReplication"]
    assert "artifacts-replica" in replication[0].props["dimensions"]["DestinationBucket"]


def test_a_pinned_database_minor_version_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"engineVersion.*major version only"):
        run_program("dev", {"mlplatform:database": {"engineVersion": "16.4"}})


def test_migrate_refuses_an_unset_token_variable_before_touching_the_database() -> None:
    from controlplane.cli import group

    result = CliRunner().invoke(group, ["migrate", "--dsn", "postgresql://nobody@127.0.0.1:1/x",
                                        "--agent-token-env", "NO_SUCH_VAR_FOR_TEST"],
                                env={"NO_SUCH_VAR_FOR_TEST": ""})
    assert result.exit_code != 0
    assert "--agent-token-env NO_SUCH_VAR_FOR_TEST: the variable is unset or empty" in result.output


def test_nodes_whose_tags_stop_at_the_node_group_are_found(runs: dict[str, Run]) -> None:
    base = runs["prod"].resources
    res = _edit(base, lambda r: r.type == "eks:index:ManagedNodeGroup",
                lambda p: p.pop("launchTemplate"))
    assert any("never reach its instances" in m for m in _checks(res, "node-tags"))
    res = _edit(base, lambda r: r.type == "aws:ec2/launchTemplate:LaunchTemplate",
                lambda p: p.update({"tagSpecifications": [
                    s for s in p["tagSpecifications"] if s["resourceType"] != "volume"]}))
    assert any("tags no volume" in m for m in _checks(res, "node-tags"))
    res = _edit(base, _kind("EC2NodeClass", "gpu"),
                lambda p: p["spec"]["tags"].pop("cost-center"))
    assert any("EC2NodeClass tags lack ['cost-center']" in m for m in _checks(res, "node-tags"))


def _class_template(name: str) -> Callable[[Resource], bool]:
    return _kind("PodTemplate", f"workload-class-{name}")


def _allow_spot(props: dict[str, Any]) -> None:
    terms = props["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    terms[0]["matchExpressions"][0]["values"] = ["spot", "on-demand"]


def test_spot_capacity_for_a_class_that_does_not_checkpoint_is_found(runs: dict[str, Run]) -> None:
    assert _checks(runs["dev"].resources, "capacity") == []
    res = _edit(runs["dev"].resources, _class_template("online-inference"), _allow_spot)
    assert any("'online-inference' is not checkpointable" in m for m in _checks(res, "capacity"))
    # no capacity requirement at all admits spot too
    res = _edit(runs["dev"].resources, _class_template("interactive-notebook"),
                lambda p: p["template"]["spec"].pop("affinity"))
    assert any("'interactive-notebook' is not checkpointable" in m
               for m in _checks(res, "capacity"))


def test_every_class_has_its_template_and_service_account_in_each_workload_namespace(
        runs: dict[str, Run]) -> None:
    from controlplane.workload_classes import CLASSES

    k8s = [r for r in runs["dev"].resources if r.props.get("kind")]
    namespaces = {(r.props.get("metadata") or {}).get("name") for r in k8s
                  if r.props["kind"] == "Namespace"
                  and r.props["metadata"].get("labels", {}).get("app.kubernetes.io/component")
                  == "workloads"}
    assert namespaces, "no workload namespace found: the test would check nothing"
    have = {(r.props["kind"], r.props["metadata"]["namespace"], r.props["metadata"]["name"])
            for r in k8s if r.props["kind"] in ("PodTemplate", "ServiceAccount")}
    for ns in namespaces:
        for wc in CLASSES.values():
            assert ("PodTemplate", ns, f"workload-class-{wc.name}") in have
            assert ("ServiceAccount", ns, wc.service_account) in have
    # the references check sees a template naming a service account nobody creates
    res = _without(runs["dev"].resources, _kind("ServiceAccount", "wc-batch-preprocessing"))
    assert any("wc-batch-preprocessing" in m for m in _checks(res, "references"))
