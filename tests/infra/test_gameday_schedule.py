"""The scheduled game day (provisioning/components/gameday.py): CronJob, least-privilege identity,
target description, config validation. Staging enables it in Pulumi.staging.yaml; prod is
enabled here through a config patch."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from provisioning.components.gameday import (
    CLUSTER_RULES,
    CONTROL_PLANE_RULES,
    CREDENTIALS,
    LEASE_RULES,
    WORKLOAD_RULES,
)
from provisioning.config import ConfigError, validate_cron
from provisioning.policies import wildcard_data_actions
from tests.infra.harness import REPO, TEST_IMAGES, Resource, Run, run_program
from tests.infra.test_policies_and_schema import K8S_VERSION, _plain, export_manifests, violations

CRONJOB = "kubernetes:batch/v1:CronJob"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
CLUSTER_ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
BINDINGS = ("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding",
            "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
PROD_GAMEDAY = {"mlplatform:gameDay": {"enabled": True, "schedule": "30 2 * * sat",
                                       "image": {"repository": "r/gameday", "tag": "1.0"},
                                       "timeZone": "Europe/Berlin", "suite": "full",
                                       "allowProd": True, "activeDeadlineSeconds": 7200},
                "mlplatform:controlPlane": {"workloadNamespaces": [
                    {"name": "mlp-workloads", "cpu": "512", "memory": "2Ti", "gpus": 32, "maxJobs": 200},
                    {"name": "mlp-research"}]}}


@pytest.fixture(scope="module")
def prod_enabled() -> Run:
    return run_program("prod", PROD_GAMEDAY)


def _gameday(run: Run) -> list[Resource]:
    return [r for r in run.resources if r.parent_types[-1:] == ["mlplatform:infra:GameDaySchedule"]]


def _cronjob(run: Run) -> dict[str, Any]:
    return run.one(CRONJOB, "gameday").props


def _pod(run: Run) -> dict[str, Any]:
    return _cronjob(run)["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def _bucket_id(run: Run) -> str:
    """The artifact bucket's id (= its name in AWS; "<resource name>-id" under PlatformMocks),
    which the program exports as artifactBucket."""
    return f"{run.one('aws:s3/bucket:Bucket', 'artifacts-bucket').name}-id"


def _error(stack: str, patch: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        run_program(stack, patch)
    return str(info.value)


# -- the CronJob ---------------------------------------------------------------------------------
def test_staging_cronjob_runs_gameday_gate_weekly_without_overlap(runs: dict[str, Run]) -> None:
    run = runs["staging"]
    cj = _cronjob(run)
    assert cj["metadata"]["name"] == "gameday" and cj["metadata"]["namespace"] == "mlp-controlplane"
    spec = cj["spec"]
    assert (spec["schedule"], spec["timeZone"]) == ("0 6 * * 2", "Etc/UTC")
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["startingDeadlineSeconds"] > 0
    assert spec["successfulJobsHistoryLimit"] >= 1 and spec["failedJobsHistoryLimit"] >= 1
    job = spec["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0 and job["activeDeadlineSeconds"] == 3600
    pod = _pod(run)
    assert pod["serviceAccountName"] == "gameday" and pod["restartPolicy"] == "Never"
    (c,) = pod["containers"]
    # the harness image (Dockerfile target `gameday`), not the slim control-plane image
    # the registry's `gameday` repository at the digest the application stack recorded
    assert c["image"] == ("123456789012.dkr.ecr.eu-west-1.amazonaws.com/mlplatform-staging/gameday@"
                          + TEST_IMAGES["gameday"])
    assert c["command"] == ["gameday"]
    # the pod's /runs dies with it: runs are archived in the artifact bucket (never overwritten)
    assert c["args"] == ["gate", "--env", "staging", "--suite", "core",
                         "--target", "/etc/gameday/target.json", "--runs-dir", "/runs",
                         "--freeze-file", "/etc/gameday/freeze-windows.yaml",
                         "--archive", f"s3://{_bucket_id(run)}/gameday-archive",
                         "--budget-check"]
    assert "--allow-prod" not in c["args"]
    # Credentials only as env vars from Secrets (the store DSN for the snapshot, an agent
    # token for the fencing probe, the game-day project's token), never in the ConfigMap.
    from_secrets = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if e.get("valueFrom")}
    assert from_secrets == {
        "GAMEDAY_ADMIN_DSN": {"name": "controlplane-db", "key": "dsn"},
        "GAMEDAY_AGENT_TOKEN": {"name": "controlplane-agent-token", "key": "token"},
        "GAMEDAY_PROJECT_TOKEN": {"name": "gameday-project-token", "key": "token"}}
    assert {v for v, _, _ in CREDENTIALS} == set(from_secrets)
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/etc/gameday"].get("readOnly") is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/etc/gameday"]["name"]]["configMap"]["name"] == "gameday-target"
    assert "emptyDir" in volumes[mounts["/runs"]["name"]] and "emptyDir" in volumes[mounts["/tmp"]["name"]]
    # Non-root, read-only root filesystem, like the other control-plane pods.
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    # Control-plane placement: on-demand system nodes, never GPU.
    assert pod["nodeSelector"] == {"platform.gameday/pool": "system"}
    assert not any(t.get("key") == "nvidia.com/gpu" for t in pod["tolerations"])
    api = run.one("kubernetes:apps/v1:Deployment", "-api").props["spec"]["template"]["spec"]
    assert pod["affinity"] == api["affinity"] and pod["priorityClassName"] == api["priorityClassName"]


def test_component_shape(runs: dict[str, Run]) -> None:
    run = runs["staging"]
    comp = run.one("mlplatform:infra:GameDaySchedule")
    assert comp.parent_types[-1] == "mlplatform:infra:ControlPlane"
    kinds = sorted(r.props["kind"] for r in _gameday(run) if "kind" in r.props)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "CronJob", "Role", "Role",
                     "RoleBinding", "RoleBinding", "ServiceAccount"]


def test_disabled_by_default_in_dev_and_prod(runs: dict[str, Run]) -> None:
    for stack in ("dev", "prod"):
        run = runs[stack]
        assert not run.of_type(CRONJOB) and not run.of_type("mlplatform:infra:GameDaySchedule")
        assert not [r for r in run.of_type("aws:iam/role:Role") if "gameday" in r.name]


def test_prod_enabled_with_allow_prod(prod_enabled: Run) -> None:
    spec = _cronjob(prod_enabled)["spec"]
    assert (spec["schedule"], spec["timeZone"]) == ("30 2 * * sat", "Europe/Berlin")
    assert spec["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 7200
    args = _pod(prod_enabled)["containers"][0]["args"]
    assert args[:5] == ["gate", "--env", "prod", "--suite", "full"] and args[-1] == "--allow-prod"
    # One Role per workload namespace, each bound to the gameday service account only.
    ns_roles = {r.props["metadata"]["namespace"] for r in prod_enabled.of_type(ROLE)
                if r.props["metadata"]["name"] == "gameday"}
    assert ns_roles == {"mlp-controlplane", "mlp-workloads", "mlp-research"}
    assert violations(prod_enabled.resources) == []


# -- Kubernetes RBAC ------------------------------------------------------------------------------
def _rules(run: Run) -> dict[tuple[str, str | None], list[dict[str, Any]]]:
    return {(r.props["kind"], r.props["metadata"].get("namespace")): r.props["rules"]
            for r in _gameday(run) if r.type in (ROLE, CLUSTER_ROLE)}


@pytest.mark.parametrize("which", ["staging", "prod"])
def test_rbac_is_least_privilege(runs: dict[str, Run], prod_enabled: Run, which: str) -> None:
    run = runs["staging"] if which == "staging" else prod_enabled
    rules = _rules(run)
    for (kind, ns), rs in rules.items():
        for rule in rs:
            for key in ("verbs", "resources", "apiGroups"):
                assert not any("*" in v for v in rule[key]), (kind, ns, rule)
            assert "resourceNames" not in rule or rule["resourceNames"]
    assert rules[("Role", "mlp-controlplane")] == [*CONTROL_PLANE_RULES, *LEASE_RULES]
    # The lock: the Lease can be created, and only the game-day Lease read and updated (no
    # delete, no list/watch: release is an update clearing the holder).
    leases = [r for r in rules[("Role", "mlp-controlplane")] if r["resources"] == ["leases"]]
    assert all(r["apiGroups"] == ["coordination.k8s.io"] for r in leases)
    assert [r["verbs"] for r in leases if "resourceNames" not in r] == [["create"]]
    assert [(r["resourceNames"], r["verbs"]) for r in leases if "resourceNames" in r] == [
        (["gameday-lock"], ["get", "update"])]
    assert not any(r["resources"] == ["leases"] for (kind, ns), rs in rules.items()
                   if (kind, ns) != ("Role", "mlp-controlplane") for r in rs)
    cluster = rules[("ClusterRole", None)]
    assert cluster == CLUSTER_RULES
    assert {res for r in cluster for res in r["resources"]} == {
        "nodes", "pods", "pods/eviction", "nodepools", "nodeclaims"}
    # Karpenter: read and patch only the workload pools' NodePools (named as the program
    # declares them), list and delete NodeClaims; never create, update or delete a NodePool.
    karpenter = [r for r in cluster if r["apiGroups"] == ["karpenter.sh"]]
    assert [(r["resources"], r.get("resourceNames"), r["verbs"]) for r in karpenter] == [
        (["nodepools"], sorted(_nodepools(run).values()), ["get", "patch"]),
        (["nodeclaims"], None, ["list", "delete"])]
    assert "system" not in _nodepools(run)
    assert {v for r in cluster if r["resources"] == ["pods"] for v in r["verbs"]} <= {"get", "list"}
    assert [r["verbs"] for r in cluster if r["resources"] == ["pods/eviction"]] == [["create"]]
    assert not {"delete", "create", "deletecollection"} & {v for r in cluster if r["resources"] == ["nodes"]
                                                           for v in r["verbs"]}
    for (kind, ns), rs in rules.items():
        if kind == "Role" and ns != "mlp-controlplane":
            assert rs == WORKLOAD_RULES
            assert {res for r in rs for res in r["resources"]} == {"networkpolicies"}
    for b in (r for r in _gameday(run) if r.type in BINDINGS):
        assert b.props["subjects"] == [{"kind": "ServiceAccount", "name": "gameday",
                                        "namespace": "mlp-controlplane"}]


# -- AWS IAM (IRSA) -------------------------------------------------------------------------------
def test_irsa_role_is_bound_to_the_service_account_and_scoped_to_the_stack(runs: dict[str, Run]) -> None:
    run = runs["staging"]
    role = run.one("aws:iam/role:Role", "gameday")
    sa = run.one("kubernetes:core/v1:ServiceAccount", "gameday").props
    assert sa["metadata"]["name"] == "gameday"
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == role.props["arn"]
    assert sa["automountServiceAccountToken"] is True
    trust = json.loads(role.props["assumeRolePolicy"])["Statement"][0]
    assert "system:serviceaccount:mlp-controlplane:gameday" in trust["Condition"]["StringEquals"].values()
    # artifact_store_unreachable denies object access to "<prefix>-irsa-*"; not to this role.
    assert not role.props["name"].startswith("mlplatform-staging-irsa-")

    doc = json.loads(run.one("aws:iam/rolePolicy:RolePolicy", "gameday").props["policy"])
    assert wildcard_data_actions(doc) == []
    by_action: dict[str, dict[str, Any]] = {}
    for st in doc["Statement"]:
        assert st["Effect"] == "Allow"
        for action in st["Action"]:
            service, _, name = action.partition(":")
            assert "*" not in action and service in ("rds", "s3", "eks", "ec2", "kms") and name
            resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            if action in by_action:  # the same action in two statements: their resources
                resources = by_action[action]["Resource"] + resources
            by_action[action] = {**st, "Resource": resources}
    # No node group is a fault target any more (Karpenter owns cpu/gpu): no EKS action at all.
    assert sorted(by_action) == sorted([
        "rds:DescribeDBInstances", "rds:RebootDBInstance", "s3:GetBucketPolicy", "s3:PutBucketPolicy",
        "s3:DeleteBucketPolicy", "ec2:DescribeInstances", "ec2:TerminateInstances", "s3:ListBucket",
        "s3:GetObject", "s3:PutObject", "kms:Decrypt", "kms:GenerateDataKey"])
    # Every resource is one of this stack's, except DescribeInstances (no resource-level permissions).
    for action, st in by_action.items():
        resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        if action == "ec2:DescribeInstances":
            assert resources == ["*"]
            continue
        assert all("*" not in r.rsplit("/", 1)[0] for r in resources if not r.endswith(":instance/*")), resources

    db = run.one("aws:rds/instance:Instance").props["identifier"]
    assert by_action["rds:RebootDBInstance"]["Resource"] == [f"arn:aws:rds:eu-west-1:123456789012:db:{db}"]
    bucket = _bucket_id(run)
    assert by_action["s3:PutBucketPolicy"]["Resource"] == [f"arn:aws:s3:::{bucket}"]
    # evidence is read-only: the listing, and objects under the evidence prefixes only
    # (test_gameday_evidence_iam.py checks them against what the evidence reads); objects
    # are written under the run archive's prefix only
    assert by_action["s3:ListBucket"]["Resource"] == [f"arn:aws:s3:::{bucket}"]
    assert sorted(by_action["s3:GetObject"]["Resource"]) == [
        f"arn:aws:s3:::{bucket}/artifacts/*", f"arn:aws:s3:::{bucket}/checkpoints/*",
        f"arn:aws:s3:::{bucket}/gameday-archive/*",
        f"arn:aws:s3:::{bucket}/local-checkpoints/*"]
    assert by_action["s3:PutObject"]["Resource"] == [f"arn:aws:s3:::{bucket}/gameday-archive/*"]
    key = run.one("aws:kms/key:Key", "-data-key").props["arn"]
    assert by_action["kms:Decrypt"]["Resource"] == by_action["kms:GenerateDataKey"]["Resource"] == [key]


def _nodepools(run: Run) -> dict[str, str]:
    """pool -> name of the Karpenter NodePools the program declares (autoscaling.py)."""
    return {r.props["spec"]["template"]["metadata"]["labels"]["platform.gameday/pool"]:
            r.props["metadata"]["name"] for r in run.of_type("kubernetes:karpenter.sh/v1:NodePool")}


def _node_fault_problems(run: Run, doc: dict[str, Any]) -> list[str]:
    """What is wrong with the game-day policy's node faults, against the rendered program."""
    by_action = {a: st for st in doc["Statement"] for a in st["Action"]}
    pools, problems = _nodepools(run), []
    cluster = run.one("eks:index:Cluster").props["name"]
    terminate = by_action.get("ec2:TerminateInstances", {})
    if terminate.get("Resource") != ["arn:aws:ec2:eu-west-1:123456789012:instance/*"]:
        problems.append(f"TerminateInstances resource {terminate.get('Resource')}")
    # The tags Karpenter puts on the instances it launches: this cluster's, these NodePools'.
    want = {f"aws:ResourceTag/kubernetes.io/cluster/{cluster}": "owned",
            "aws:ResourceTag/eks:eks-cluster-name": cluster,
            "aws:ResourceTag/karpenter.sh/nodepool": [pools["cpu"], pools["gpu"]]}
    if terminate.get("Condition") != {"StringEquals": want}:
        problems.append(f"TerminateInstances condition {terminate.get('Condition')} != {want}")
    # The system pool (control plane, this CronJob's own pod) is out of reach: its node group
    # is never named, and no EKS node-group action is granted.
    system = [r.props["nodeGroupName"] for r in run.of_type("eks:index:ManagedNodeGroup")]
    problems += [f"names the system node group {n}" for n in system if n in json.dumps(doc)]
    problems += [f"grants {a}" for a in by_action if a.startswith("eks:")]
    return problems


def test_game_day_node_faults_target_existing_nodepools(runs: dict[str, Run]) -> None:
    run = runs["staging"]
    assert sorted(_nodepools(run)) == ["cpu", "gpu"]
    doc = json.loads(run.one("aws:iam/rolePolicy:RolePolicy", "gameday").props["policy"])
    assert _node_fault_problems(run, doc) == []
    # Mutation: the policy before this follow-up (removed node groups, eks:nodegroup-name).
    stale = copy.deepcopy(doc)
    for st in stale["Statement"]:
        if "ec2:TerminateInstances" in st["Action"]:
            st["Condition"] = {"StringEquals": {
                "aws:ResourceTag/eks:nodegroup-name": ["mlplatform-staging-cpu",
                                                       "mlplatform-staging-gpu"]}}
    stale["Statement"].append({"Effect": "Allow", "Action": ["eks:UpdateNodegroupConfig"],
                               "Resource": ["arn:aws:eks:*:*:nodegroup/x/mlplatform-staging-system/*"]})
    found = _node_fault_problems(run, stale)
    assert len(found) == 3 and "grants eks:UpdateNodegroupConfig" in found, found


def test_game_day_fault_statements_grant_eks_only_for_node_groups(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import pulumi

    from provisioning.components.identity import game_day_fault_statements

    # Plain strings: an Output created outside a Pulumi run leaves work behind that hangs the
    # next mocked program run.
    monkeypatch.setattr(pulumi.Output, "concat", staticmethod(lambda *a: "".join(map(str, a))))

    def actions(pools: list[str], groups: list[str]) -> set[str]:
        return {a for st in game_day_fault_statements("eu-west-1", "1", "c", "db", ["b"], pools,
                                                      groups) for a in st["Action"]}

    assert not any(a.startswith("eks:") for a in actions(["cpu"], []))
    assert "eks:UpdateNodegroupConfig" in actions([], ["c-batch"])
    with pytest.raises(ValueError, match="at least one NodePool or node group"):
        actions([], [])


# -- the target description -------------------------------------------------------------------------
def test_target_configmap_names_what_the_stack_declares(runs: dict[str, Run], tmp_path: Path) -> None:
    from environments.cloud.driver import CloudTarget

    run = runs["staging"]
    cm = run.one("kubernetes:core/v1:ConfigMap", "gameday-target").props
    assert cm["metadata"] == {**cm["metadata"], "name": "gameday-target", "namespace": "mlp-controlplane"}
    target = json.loads(cm["data"]["target.json"])
    image = _pod(run)["containers"][0]["image"]
    assert target == {
        "apiUrl": "http://controlplane-api.mlp-controlplane.svc:8080",
        "prometheusUrl": "http://kube-prometheus-stack-prometheus.monitoring.svc:9090",
        "workloadImage": image, "platformProject": "gameday",
        "adminDsnEnv": "GAMEDAY_ADMIN_DSN", "agentTokenEnv": "GAMEDAY_AGENT_TOKEN",
        "projectTokenEnv": "GAMEDAY_PROJECT_TOKEN",
        "environment": "staging", "project": "mlplatform", "stack": "staging", "region": "eu-west-1",
        "clusterName": run.one("eks:index:Cluster").props["name"],
        "controlPlaneNamespace": "mlp-controlplane", "workloadNamespaces": ["mlp-workloads"],
        "agentPools": ["cpu", "gpu"],
        "artifactBucket": _bucket_id(run),
        "artifactBuckets": [_bucket_id(run)],
        "databaseIdentifier": run.one("aws:rds/instance:Instance").props["identifier"],
        "nodePools": target["nodePools"],  # see test_target_configmap_nodepools_exist
    }
    # The runner accepts it as is for `--env staging`, and hands the driver keys to the cloud
    # drivers (which refuse unknown keys).
    from environments.cloud.env import CloudTargetFile

    path = tmp_path / "target.json"
    path.write_text(cm["data"]["target.json"])
    loaded = CloudTargetFile.load(path, "staging")
    assert loaded.api_url == target["apiUrl"] and loaded.workload_image == image
    parsed = CloudTarget.from_config(loaded.driver_config)
    assert parsed.aws.db_instance_id == target["databaseIdentifier"]
    assert parsed.kube.namespace == "mlp-controlplane"
    # The API URL names the Service ControlPlane declares, on its port.
    svc = run.one("kubernetes:core/v1:Service", "-api-svc").props
    assert target["apiUrl"] == (f"http://{svc['metadata']['name']}.{svc['metadata']['namespace']}"
                                f".svc:{int(svc['spec']['ports'][0]['port'])}")
    # The freeze windows the CronJob honours are the repository's declared ones.
    assert cm["data"]["freeze-windows.yaml"] == (REPO / "chaos" / "freeze-windows.yaml").read_text()


# -- schema and policies ----------------------------------------------------------------------------
def test_gameday_objects_validate_and_are_in_the_exported_manifests(
    runs: dict[str, Run], prod_enabled: Run, tmp_path: Path
) -> None:
    for run in (runs["staging"], prod_enabled):
        docs = export_manifests(run, tmp_path)  # what test_every_kubernetes_object_... validates
        exported = {(d["kind"], d["metadata"]["name"]) for d in docs}
        assert {("CronJob", "gameday"), ("ConfigMap", "gameday-target"), ("ServiceAccount", "gameday"),
                ("Role", "gameday"), ("ClusterRole", f"mlplatform-{run.stack}-gameday")} <= exported
        for r in _gameday(run):
            doc = _plain({k: v for k, v in r.props.items() if k != "arn"})
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _mutated(run: Run, fn: Any) -> list[Resource]:
    out = []
    for r in run.resources:
        if r.type == CRONJOB:
            props = copy.deepcopy(r.props)
            fn(props["spec"]["jobTemplate"]["spec"]["template"]["spec"])
            r = Resource(r.urn, r.type, r.name, props)
        out.append(r)
    return out


@pytest.mark.parametrize(("mutation", "expected"), [
    (lambda pod: pod["tolerations"].append({"key": "nvidia.com/gpu", "operator": "Exists"}),
     "must not tolerate the GPU taint"),
    (lambda pod: pod.pop("affinity"), "ON_DEMAND"),
    (lambda pod: pod.update(nodeSelector={"platform.gameday/pool": "cpu"}), "select platform.gameday/pool=system"),
])
def test_placement_policy_covers_the_cronjob(runs: dict[str, Run], mutation: Any, expected: str) -> None:
    assert violations(runs["staging"].resources) == []
    found = violations(_mutated(runs["staging"], mutation))
    assert any(expected in v and "gameday-cronjob" in v for v in found), found


# -- config validation --------------------------------------------------------------------------------
def test_prod_enabled_without_allow_prod_is_refused() -> None:
    msg = _error("prod", {"mlplatform:gameDay": {"enabled": True, "schedule": "0 6 * * 2",
                                                 "image": {"repository": "r/g", "tag": "1"}}})
    assert "Pulumi.prod.yaml" in msg
    assert "mlplatform:gameDay.allowProd: must be true to schedule game days in prod" in msg


@pytest.mark.parametrize(("schedule", "expected"), [
    ("0 25 * * 2", "mlplatform:gameDay.schedule: Value error, '0 25 * * 2': hour field '25': 25 is outside 0-23"),
    ("0 6 * *", "is not a 5-field cron expression (minute hour day-of-month month day-of-week), it has 4"),
    ("@weekly", "is not a 5-field cron expression"),
])
def test_invalid_cron_is_refused_precisely(schedule: str, expected: str) -> None:
    msg = _error("staging", {"mlplatform:gameDay": {"schedule": schedule}})
    assert "mlplatform:gameDay.schedule" in msg and expected in msg


def test_other_game_day_keys_are_checked() -> None:
    assert "mlplatform:gameDay.timeZone" in _error("staging", {"mlplatform:gameDay": {"timeZone": "CEST"}})
    assert "mlplatform:gameDay.suite" in _error("staging", {"mlplatform:gameDay": {"suite": "nightly"}})
    assert "mlplatform:gameDay.shedule: unknown key" in _error(
        "dev", {"mlplatform:gameDay": {"enabled": True, "shedule": "0 6 * * 2"}})
    assert "schedule is required when enabled is true" in _error("dev", {"mlplatform:gameDay": {"enabled": True}})
    assert "gameDay.image is required when enabled is true, unless registry.repositories" in _error(
        "dev", {"mlplatform:gameDay": {"enabled": True, "schedule": "0 6 * * 2"},
                "mlplatform:registry": {"repositories": ["controlplane"]}})
    assert "mlplatform:gameDay.activeDeadlineSeconds" in _error(
        "staging", {"mlplatform:gameDay": {"activeDeadlineSeconds": 10}})


@pytest.mark.parametrize("expr", ["0 6 * * 2", "*/15 0-5,22 1 jan-mar MON-fri", "0 0 1,15 * 0", "5 4 * * 7"])
def test_valid_cron_expressions(expr: str) -> None:
    assert validate_cron(expr) == expr


@pytest.mark.parametrize(("expr", "expected"), [
    ("60 * * * *", "minute field '60': 60 is outside 0-59"),
    ("0 6 0 * *", "day-of-month field '0': 0 is outside 1-31"),
    ("0 6 * 13 *", "month field '13'"),
    ("0 6 * * 8", "day-of-week field '8': 8 is outside 0-7"),
    ("0 6 * * fr", "'fr' is not a number or a name"),
    ("0 6 * * 5-2", "range '5-2' runs backwards"),
    ("*/0 * * * *", "step '0' must be a positive integer"),
    ("TZ=UTC 0 6 * * 2", "not TZ= in the schedule"),
])
def test_invalid_cron_messages(expr: str, expected: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        validate_cron(expr)
    assert expected in str(info.value)


# -- the documented CI schedule example ---------------------------------------------------------------
def test_ci_schedule_example_never_overlaps_and_keeps_evidence() -> None:
    import yaml

    wf = yaml.safe_load((REPO / "docs" / "examples" / "gameday-schedule.yml").read_text())
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert on["schedule"][0]["cron"] and "workflow_dispatch" in on
    validate_cron(on["schedule"][0]["cron"])
    assert wf["concurrency"] == {"group": "gameday", "cancel-in-progress": False}
    steps = wf["jobs"]["gameday"]["steps"]
    runs_ = "\n".join(s.get("run", "") for s in steps)
    assert "make setup" in runs_ and ".venv/bin/gameday gate --env local --suite" in runs_
    assert wf["jobs"]["gameday"]["env"]["SUITE"].endswith("'ci' }}")
    uploads = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert {s["with"]["path"] for s in uploads} == {"runs/", "runs/*/junit.xml"}
    assert all(s.get("if") == "always()" for s in uploads)


def test_target_configmap_nodepools_exist(runs: dict[str, Run]) -> None:
    from environments.cloud.driver import CloudTarget

    run = runs["staging"]
    target = json.loads(run.one("kubernetes:core/v1:ConfigMap", "gameday-target").props["data"]["target.json"])
    assert target["nodePools"] == _nodepools(run)
    assert "nodeGroups" not in target  # the system node group is never a fault target
    parsed = CloudTarget.from_config({k: v for k, v in target.items() if k in CloudTarget.KEYS})
    assert parsed.aws.nodepools == parsed.kube.node_pools == _nodepools(run)
    assert parsed.aws.nodegroups == {}
