"""The program under Pulumi mocks, once per stack: what it registers, per environment."""

from __future__ import annotations

import json

import pytest

from tests.infra.harness import Run, real_rules_available, stack_config

RDS = "aws:rds/instance:Instance"
MNG = "eks:index:ManagedNodeGroup"


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_cluster_is_api_auth_oidc_pinned_without_default_nodes(runs: dict[str, Run], stack: str) -> None:
    c = runs[stack].one("eks:index:Cluster")
    p = c.props
    assert (p["authenticationMode"], p["createOidcProvider"], p["skipDefaultNodeGroup"]) == ("API", True, True)
    assert p["version"] == "1.33" and p["name"] == f"mlplatform-{stack}"
    assert p["vpcCniOptions"]["enableNetworkPolicy"] is True
    assert p["kubeProxyAddonOptions"]["enabled"]
    # CoreDNS is not created inside the component (before any node): see the next test.
    assert p["corednsAddonOptions"]["enabled"] is False


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_coredns_is_an_addon_created_after_the_system_node_group(runs: dict[str, Run], stack: str) -> None:
    from provisioning.deploy_graph import build

    run = runs[stack]
    graph = build(run.layer(stack), [stack])
    addon = graph.nodes[run.one("aws:eks/addon:Addon", "coredns").urn]
    assert addon.props["addonName"] == "coredns"
    assert addon.props["clusterName"] == f"mlplatform-{stack}"
    before = graph.before(addon)
    assert run.one(MNG, "pool-system").urn in before
    assert run.one("eks:index:Cluster").urn in before


def test_network_zones_nat_endpoints_flow_logs(runs: dict[str, Run]) -> None:
    for stack, zones, nats in (("dev", 2, 1), ("staging", 2, 2), ("prod", 3, 3)):
        run = runs[stack]
        subnets = run.of_type("aws:ec2/subnet:Subnet")
        assert len({s.props["availabilityZone"] for s in subnets}) == zones
        assert len(run.of_type("aws:ec2/natGateway:NatGateway")) == nats
        services = sorted(e.props["serviceName"].rsplit(".", 2)[-2:][-1] if "ecr" not in e.props["serviceName"]
                          else e.props["serviceName"].split("eu-west-1.")[1]
                          for e in run.of_type("aws:ec2/vpcEndpoint:VpcEndpoint"))
        assert services == ["ecr.api", "ecr.dkr", "s3", "sts"]
        assert run.one("aws:ec2/flowLog:FlowLog").props["trafficType"] == "ALL"


def test_node_pools(runs: dict[str, Run]) -> None:
    # Only `system` is a managed node group; cpu/gpu are Karpenter NodePools, checked in
    # tests/infra/test_autoscaling.py (labels, taints, scale to zero, spot where allowed).
    for stack, run in runs.items():
        pools = {r.props["labels"]["platform.gameday/pool"]: r.props for r in run.of_type(MNG)}
        assert set(pools) == {"system"}
        assert pools["system"]["capacityType"] == "ON_DEMAND"
        gpu = next(r.props for r in run.of_type("kubernetes:karpenter.sh/v1:NodePool")
                   if r.props["metadata"]["name"] == "gpu")["spec"]
        assert "minSize" not in json.dumps(gpu) and "replicas" not in gpu  # scale to zero
        ami = stack_config(stack)["mlplatform:nodePools"]["gpu"]["amiType"]
        assert gpu["template"]["metadata"]["labels"]["platform.gameday/accelerator"].startswith("nvidia-")
        capacity = next(r["values"] for r in gpu["template"]["spec"]["requirements"]
                        if r["key"] == "karpenter.sh/capacity-type")
        assert capacity == (["on-demand"] if stack == "prod" else ["spot", "on-demand"])
        # Device plugin only where the AMI lacks it (staging runs Bottlerocket).
        plugins = [r for r in run.of_type("kubernetes:apps/v1:DaemonSet")
                   if r.props["metadata"]["name"] == "nvidia-device-plugin"]
        assert len(plugins) == (0 if ami.startswith("BOTTLEROCKET") else 1)


def test_registries_immutable_scanned_kms_with_lifecycle(runs: dict[str, Run]) -> None:
    run = runs["prod"]
    repos = run.of_type("aws:ecr/repository:Repository")
    assert {r.props["name"] for r in repos} == {"mlplatform-prod/controlplane", "mlplatform-prod/gameday",
                                                  "mlplatform-prod/workloads/trainer",
                                                  "mlplatform-prod/serving", "mlplatform-prod/tracking"}
    for r in repos:
        assert r.props["imageTagMutability"] == "IMMUTABLE"
        assert r.props["imageScanningConfiguration"]["scanOnPush"] is True
        assert r.props["encryptionConfigurations"][0]["encryptionType"] == "KMS"
    rules = [json.loads(p.props["policy"])["rules"] for p in run.of_type("aws:ecr/lifecyclePolicy:LifecyclePolicy")]
    assert len(rules) == len(repos) and all(len(r) == 2 for r in rules)


def test_artifact_replication_follows_objective_scope(runs: dict[str, Run]) -> None:
    # prod's artifact-store-unavailable objective has scope "region"; dev/staging "zone".
    assert len(runs["prod"].of_type("aws:s3/bucketReplicationConfig:BucketReplicationConfig")) == 1
    assert len([b for b in runs["prod"].of_type("aws:s3/bucket:Bucket") if "-artifacts" in b.name]) == 2
    for stack in ("dev", "staging"):
        assert runs[stack].of_type("aws:s3/bucketReplicationConfig:BucketReplicationConfig") == []
    lifecycle = runs["dev"].one("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
                                "artifacts")
    ids = {r["id"] for r in lifecycle.props["rules"]}
    assert ids == {"abort-incomplete-uploads", "expire-noncurrent-versions"}


def test_database_follows_objectives(runs: dict[str, Run]) -> None:
    from slo.specs import load_specs

    for stack, run in runs.items():
        ro = load_specs(env=stack).recovery_objectives["db-primary-loss"]
        db = run.one(RDS).props
        assert db["multiAz"] is True  # RPO 0 acknowledged submissions in every env
        assert db["backupRetentionPeriod"] >= (ro.backup_retention_days or 1)
        assert db["manageMasterUserPassword"] is True and db["storageEncrypted"] is True
        assert db["deletionProtection"] is (stack != "dev")
        assert db["skipFinalSnapshot"] is (stack == "dev")
        if stack != "dev":
            assert db["finalSnapshotIdentifier"] == f"mlplatform-{stack}-controlplane-final"
    assert runs["prod"].one(RDS).props["backupRetentionPeriod"] == 35


def test_control_plane_deployments(runs: dict[str, Run]) -> None:
    run = runs["prod"]
    deps = {d.props["metadata"]["name"]: d.props for d in run.of_type("kubernetes:apps/v1:Deployment")}
    # and the tracking server (tests/infra/test_serving_infra.py)
    assert set(deps) == {"controlplane-api", "controlplane-reconciler", "controlplane-agent-cpu",
                         "controlplane-agent-gpu", "mlflow"}
    api = deps["controlplane-api"]
    assert api["spec"]["replicas"] == 3
    pod = api["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"].endswith("@sha256:" + "0" * 64)
    assert c["args"][:2] == ["controlplane", "api"] and c["command"] == ["gameday"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    zone = pod["topologySpreadConstraints"][0]
    assert (zone["topologyKey"], zone["whenUnsatisfiable"]) == ("topology.kubernetes.io/zone", "DoNotSchedule")
    # The reconciler's probes hit its own health server (controlplane/health.py), on the pod IP.
    rec = deps["controlplane-reconciler"]["spec"]["template"]["spec"]["containers"][0]
    port = rec["ports"][0]["containerPort"]  # a float once through the mocks
    assert float(rec["args"][rec["args"].index("--metrics-port") + 1]) == port
    assert rec["args"][rec["args"].index("--metrics-host") + 1] == "0.0.0.0"
    assert rec["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    assert rec["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    gpu_agent = deps["controlplane-agent-gpu"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert gpu_agent[gpu_agent.index("--runtime") + 1] == "kubernetes"
    assert gpu_agent[gpu_agent.index("--pool") + 1] == "gpu"
    pdbs = {p.props["metadata"]["name"]: p.props for p in run.of_type("kubernetes:policy/v1:PodDisruptionBudget")}
    assert pdbs["controlplane-api"]["spec"]["minAvailable"] == 2


def test_workloads_cannot_reach_database(runs: dict[str, Run]) -> None:
    run = runs["prod"]
    policy = next(r.props for r in run.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")
                  if r.props["metadata"]["name"] == "workload-isolation")
    db_cidrs = sorted(s.props["cidrBlock"] for s in run.of_type("aws:ec2/subnet:Subnet")
                      if "-database-" in s.name)
    ports = sorted(p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"])
    assert 5432 not in ports
    ip_rule = next(r for r in policy["spec"]["egress"] if "ipBlock" in r["to"][0])
    assert sorted(ip_rule["to"][0]["ipBlock"]["except"]) == db_cidrs
    db_sg = run.one("aws:ec2/securityGroup:SecurityGroup", "-db-sg").props
    assert db_sg["ingress"][0]["securityGroups"] == ["sg-cluster"]
    quotas = run.of_type("kubernetes:core/v1:ResourceQuota")
    assert quotas[0].props["spec"]["hard"]["requests.nvidia.com/gpu"] == "32"


def test_workload_identity_scoped_to_exact_resources(runs: dict[str, Run]) -> None:
    run = runs["prod"]
    trusts = {r.props["tags"]["platform.gameday/service-account"]: json.loads(r.props["assumeRolePolicy"])
              for r in run.of_type("aws:iam/role:Role") if "platform.gameday/service-account" in r.props["tags"]}
    assert "mlp-workloads/workload" in trusts and "mlp-controlplane/api" in trusts
    for sa, doc in trusts.items():
        cond = doc["Statement"][0]["Condition"]["StringEquals"]
        assert f"system:serviceaccount:{sa.replace('/', ':')}" in cond.values()
    policies = {r.name: json.loads(r.props["policy"]) for r in run.of_type("aws:iam/rolePolicy:RolePolicy")}
    esod = policies["mlplatform-prod-irsa-external-secrets-db-policy"]["Statement"][0]
    assert esod["Resource"] == [run.one(RDS).props["masterUserSecrets"][0]["secretArn"]]


def test_every_resource_named_from_project_and_stack(runs: dict[str, Run]) -> None:
    for stack, run in runs.items():
        # A StackReference is named by the stack it reads (Pulumi's rule).
        bad = [r.name for r in run.resources if not r.name.startswith(f"mlplatform-{stack}")
               and r.type != "pulumi:pulumi:StackReference"]
        assert bad == []


def test_observability(runs: dict[str, Run]) -> None:
    run = runs["prod"]
    rule = run.one("kubernetes:monitoring.coreos.com/v1:PrometheusRule")
    assert rule.props["spec"]["groups"]
    alarms = {a.props["name"]: a.props for a in run.of_type("aws:cloudwatch/metricAlarm:MetricAlarm")}
    assert "mlplatform-prod-s3-replication-failed" in alarms
    assert alarms["mlplatform-prod-rds-cpu"]["evaluationPeriods"] == 1  # RTO 120s -> detect in 60s
    stop = run.one("aws:cloudwatch/compositeAlarm:CompositeAlarm").props
    assert stop["alarmRule"].count("ALARM(") == len(alarms)


@pytest.mark.skipif(not real_rules_available(), reason="slo.rules has not landed yet")
def test_prometheus_rules_are_exactly_what_slo_generates(runs: dict[str, Run]) -> None:
    from slo.rules import generate_rules
    from slo.specs import load_specs

    rule = runs["prod"].one("kubernetes:monitoring.coreos.com/v1:PrometheusRule")
    expected = generate_rules(load_specs(env="prod"))["groups"]
    got = rule.props["spec"]["groups"]
    assert [g["name"] for g in got] == [g["name"] for g in expected]
    assert [[r.get("alert") or r.get("record") for r in g["rules"]] for g in got] == [
        [r.get("alert") or r.get("record") for r in g["rules"]] for g in expected]


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_every_scraped_pod_listens_beyond_loopback(runs: dict[str, Run], stack: str) -> None:
    """The PodMonitor scrapes the reconciler and agents on the pod IP (issue 49 item 3)."""
    deps = [d.props for d in runs[stack].of_type("kubernetes:apps/v1:Deployment")
            if d.props["metadata"]["name"].startswith(("controlplane-agent-", "controlplane-reconciler"))]
    assert len(deps) >= 2
    for d in deps:
        args = d["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--metrics-host") + 1] == "0.0.0.0", d["metadata"]["name"]


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_alarms_do_not_breach_on_missing_data(runs: dict[str, Run], stack: str) -> None:
    """Before the application layer exists nothing connects to RDS: missing data must not hold
    the FIS stop condition in ALARM (issue 49 item 7)."""
    alarms = runs[stack].of_type("aws:cloudwatch/metricAlarm:MetricAlarm")
    assert {a.props["name"]: a.props["treatMissingData"] for a in alarms
            if a.props["treatMissingData"] != "notBreaching"} == {}


def _prod_without_rtc() -> Run:
    """prod with an artifacts RPO above zero: replicated, without Replication Time Control."""
    from slo.specs import load_specs
    from tests.infra.harness import objectives_for, run_program

    ro = load_specs(env="prod").recovery_objectives["artifact-store-unavailable"]
    rpo = ro.rpo.model_copy(update={"artifacts": 300})
    return run_program("prod", objectives=objectives_for(
        "prod", {"artifact-store-unavailable": {"rpo": rpo}}), layers=("platform",))


@pytest.mark.parametrize("variant", ["prod", "prod-without-rtc"])
def test_replication_alarm_has_replication_metrics(runs: dict[str, Run], variant: str) -> None:
    """OperationsFailedReplication exists only for rules with replication metrics on; they are
    on with or without Replication Time Control (issue 49 item 7)."""
    run = runs["prod"] if variant == "prod" else _prod_without_rtc()
    assert (variant == "prod") is bool(run.one(
        "aws:s3/bucketReplicationConfig:BucketReplicationConfig").props["rules"][0][
            "destination"].get("replicationTime"))
    alarm = run.one("aws:cloudwatch/metricAlarm:MetricAlarm", "s3-replication-failed").props
    rules = {r["id"]: r for r in run.one(
        "aws:s3/bucketReplicationConfig:BucketReplicationConfig").props["rules"]}
    rule = rules[alarm["dimensions"]["RuleId"]]
    assert rule["destination"]["metrics"]["status"] == "Enabled"
    rtc = rule["destination"].get("replicationTime")
    # the event threshold is RTC's: present exactly when RTC is on
    assert ("eventThreshold" in rule["destination"]["metrics"]) is bool(rtc)
