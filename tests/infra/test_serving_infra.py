"""Serving and tracking in the Pulumi program (docs/infra.md, "Serving and tracking"), checked
offline: what every stack declares, and each new check failing on a mutation of the real
rendered program that breaks what it guards."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from provisioning import deployability as d
from provisioning.config import ConfigError, parse_stack_config
from provisioning.deploy_graph import Graph
from provisioning.layers import outputs as out
from provisioning.rehearsal import rehearse
from tests.infra.harness import Resource, Run, app_stack, run_program, stack_config
from tests.infra.test_rehearsal import checks, drop_deps, graph_of, mutated, named, props

STACKS = ("dev", "staging", "prod")


def _objs(run: Run, kind: str) -> list[Resource]:
    return [r for r in run.k8s_objects() if r.props["kind"] == kind]


def _one(run: Run, kind: str, name: str) -> dict[str, Any]:
    found = [r.props for r in _objs(run, kind) if r.props["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, found)
    return found[0]


@pytest.fixture(scope="module")
def dev(runs: dict[str, Run]) -> Graph:
    return graph_of(runs["dev"])


# --- what every stack declares ----------------------------------------------------------------

@pytest.mark.parametrize("stack", STACKS)
def test_serving_is_ha_ready_gated_and_scaled_on_request_rate(runs: dict[str, Run], stack: str) -> None:
    run, cfg = runs[stack], parse_stack_config(
        {k.split(":", 1)[1]: v for k, v in stack_config(stack).items() if k.startswith("mlplatform:")})
    assert cfg.serving is not None
    rollout = _one(run, "Rollout", "model-server")
    pod = rollout["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == f"/v2/models/{cfg.serving.model.name}/ready"
    assert container["image"].endswith("@sha256:" + "2" * 64)  # the recorded serving digest
    assert "replicas" not in rollout["spec"]  # KEDA owns the count
    scaler = _one(run, "ScaledObject", "model-server")["spec"]
    assert scaler["minReplicaCount"] == cfg.serving.autoscaling.min_replicas >= 2
    assert scaler["scaleTargetRef"] == {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                                        "name": "model-server"}
    [trigger] = scaler["triggers"]
    assert trigger["type"] == "prometheus" and "request_predict_seconds_count" in trigger["metadata"]["query"]
    assert _one(run, "PodDisruptionBudget", "model-server")["spec"]["minAvailable"] >= 1
    steps = rollout["spec"]["strategy"]["canary"]["steps"]
    assert [s["setWeight"] for s in steps if "setWeight" in s] == cfg.serving.rollout.steps
    # the model server's role reads models/ only
    policy = next(r for r in run.layer(stack) if r.type == "aws:iam/rolePolicy:RolePolicy"
                  and r.name == f"mlplatform-{stack}-irsa-serving-policy").props["policy"]
    actions = {a for st in json.loads(policy)["Statement"] for a in st["Action"]}
    assert actions == {"s3:ListBucket", "s3:GetObject", "kms:Decrypt"}
    assert "/models/*" in policy and "PutObject" not in policy


@pytest.mark.parametrize("stack", STACKS)
def test_tracking_server_waits_for_its_role_and_schema(runs: dict[str, Run], stack: str) -> None:
    run = runs[stack]
    graph = graph_of(run)
    by_name = {n.name: n for n in graph.nodes.values()}
    server = by_name[f"mlplatform-{stack}-tracking-server"]
    init = by_name[f"mlplatform-{stack}-tracking-db-init"]
    upgrade = by_name[f"mlplatform-{stack}-tracking-db-upgrade"]
    assert init.urn in graph.before(upgrade) and upgrade.urn in graph.before(server)
    deployment = _one(run, "Deployment", "mlflow")
    assert deployment["spec"]["replicas"] >= 2
    [c] = deployment["spec"]["template"]["spec"]["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "--serve-artifacts" in c["args"]
    assert any(str(a).startswith("s3://") and str(a).endswith("/mlflow") for a in c["args"])
    assert _one(run, "PodDisruptionBudget", "mlflow")["spec"]["minAvailable"] >= 1
    # its own role and database, not the control plane's
    uri = _one(run, "ExternalSecret", "tracking-db")["spec"]["target"]["template"]["data"]["uri"]
    assert uri.startswith("postgresql://mlflow:") and "/mlflow?sslmode=require" in uri
    # training workloads may reach it (and nothing else new)
    isolation = next(p for p in (r.props for r in _objs(run, "NetworkPolicy"))
                     if p["metadata"]["name"] == "workload-isolation")
    assert {"to": [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "mlp-tracking"}}}],
        "ports": [{"port": 5000, "protocol": "TCP"}]} in isolation["spec"]["egress"]
    assert set(run.exports[stack][out.ROLE_ARNS]) >= {out.SERVING_ROLE, out.TRACKING_ROLE,
                                                      out.TRACKING_DB_ROLE}


# --- rehearsal: each new order rule fails on a mutation ---------------------------------------

def test_mutation_tracking_server_before_its_schema_job(dev: Graph) -> None:
    """The database role and schema before the tracking server (setup-jobs-first)."""
    graph = mutated(dev, named("tracking-server"), drop_deps("db-upgrade"))
    findings = rehearse(graph)
    assert {f.check for f in findings} == {"setup-jobs-first"}
    assert {f.message.split("before ")[-1].split()[1].rstrip(",") for f in findings} == {
        "mlplatform-dev-tracking-db-init", "mlplatform-dev-tracking-db-upgrade"}


def test_mutation_schema_job_in_parallel_with_the_role_job(dev: Graph) -> None:
    graph = mutated(dev, named("tracking-db-upgrade"), drop_deps("db-init"))
    findings = rehearse(graph)
    assert {f.check for f in findings} == {"setup-jobs-first"}
    [parallel] = [f for f in findings if "in parallel" in f.message]
    pair = f"{parallel.resource} {parallel.message}"
    assert "tracking-db-upgrade" in pair and "tracking-db-init" in pair
    # the server, which waited for the init Job only through the upgrade, no longer does
    assert any("tracking-server" in f.resource for f in findings)


def test_mutation_api_before_the_migration(dev: Graph) -> None:
    """The same rule on the control plane: the API must wait for its migrate Job."""
    graph = mutated(dev, named("cp-api", "Deployment"), drop_deps("cp-migrate"))
    findings = rehearse(graph)
    assert {f.check for f in findings} == {"setup-jobs-first"}
    assert "controlplane-db" in findings[0].message


def test_mutation_serving_before_its_charts_and_nodes(dev: Graph) -> None:
    """The CRD-owning charts (Argo Rollouts, KEDA, Prometheus) and the cpu pool before the
    Rollout, the ScaledObject and the monitors."""
    graph = mutated(dev, lambda n: n.type == "mlplatform:infra:Serving",
                    lambda n: replace(n, after=frozenset()))
    findings = rehearse(graph)
    assert {f.check for f in findings} == {"crd-first", "pods-nodes"}
    crd = {f.message.split("'")[1] for f in findings if f.check == "crd-first"}
    assert crd == {"argo-rollouts", "keda", "kube-prometheus-stack"}
    assert [f.resource for f in findings if f.check == "pods-nodes"] == [
        "kubernetes:argoproj.io/v1alpha1:Rollout mlplatform-dev-serving-rollout"]


@pytest.mark.parametrize(("chart", "values"), [
    ("delivery-argo-rollouts", {"installCRDs": False}),
    ("delivery-keda", {"crds": {"install": False}}),
])
def test_mutation_delivery_chart_without_its_crds(dev: Graph, chart: str, values: dict) -> None:
    graph = mutated(dev, named(chart, "helm"),
                    lambda n: replace(n, props={**n.props, "values": {**n.props["values"], **values}}))
    assert checks(graph) == {"crd-first"}


def test_mutation_rollout_controller_not_tolerating_the_system_taint(dev: Graph) -> None:
    graph = mutated(dev, named("delivery-argo-rollouts", "helm"),
                    props(values__controller__tolerations=[]))
    assert checks(graph) == {"pods-nodes"}


def test_mutation_model_server_pods_on_no_pool(dev: Graph) -> None:
    graph = mutated(dev, named("serving-rollout"),
                    props(spec__template__spec__nodeSelector={"platform.gameday/pool": "serving"}))
    assert checks(graph) == {"pods-nodes"}


# --- deployability `delivery`: one mutation per promise -------------------------------------

def _edit(resources: list[Resource], kind: str, change: Callable[[dict[str, Any]], None],
          name: str = "") -> list[Resource]:
    out_, hit = [], 0
    for r in resources:
        if r.props.get("kind") == kind and name in r.props["metadata"]["name"]:
            p = copy.deepcopy(r.props)
            change(p)
            r, hit = dataclasses.replace(r, props=p), hit + 1
        out_.append(r)
    assert hit, "the mutation changed nothing"
    return out_


def _delivery(resources: list[Resource]) -> list[str]:
    return [f.message for f in d.check_delivery(resources)]


def _canary(p: dict[str, Any]) -> dict[str, Any]:
    return p["spec"]["strategy"]["canary"]


def _drop_golden_step(p: dict[str, Any]) -> None:
    _canary(p)["steps"] = [s for s in _canary(p)["steps"] if "analysis" not in s]


def _without_kind(kind: str, name: str) -> Callable[[list[Resource]], list[Resource]]:
    def drop(resources: list[Resource]) -> list[Resource]:
        kept = [r for r in resources if not (r.props.get("kind") == kind
                                              and r.props["metadata"]["name"] == name)]
        assert len(kept) < len(resources)
        return kept
    return drop


MUTATIONS: list[tuple[str, Callable[[list[Resource]], list[Resource]], str]] = [
    ("one replica", lambda rs: _edit(rs, "ScaledObject", lambda p: p["spec"].update(minReplicaCount=1)),
     "as few as 1 replica"),
    ("no PDB", _without_kind("PodDisruptionBudget", "model-server"), "no PodDisruptionBudget"),
    ("no readiness", lambda rs: _edit(rs, "Rollout", lambda p: p["spec"]["template"]["spec"][
        "containers"][0].pop("readinessProbe")), "no readinessProbe"),
    ("zone spread soft", lambda rs: _edit(rs, "Rollout", lambda p: p["spec"]["template"]["spec"][
        "topologySpreadConstraints"][0].update(whenUnsatisfiable="ScheduleAnyway")), "zone spread"),
    ("no canary", lambda rs: _edit(rs, "Rollout", lambda p: p["spec"].update(
        strategy={"blueGreen": {}})), "no canary strategy"),
    ("no golden set", lambda rs: _edit(rs, "Rollout", _drop_golden_step), "['golden-set']"),
    ("no background analysis", lambda rs: _edit(rs, "Rollout", lambda p: _canary(p).pop("analysis")),
     "no background analysis"),
    ("template missing", _without_kind("AnalysisTemplate", "model-canary-metrics"),
     "'model-canary-metrics' is not an AnalysisTemplate"),
    ("argument not passed", lambda rs: _edit(rs, "Rollout", lambda p: _canary(p)["analysis"].update(
        args=[])), "needs argument 'canary-hash'"),
    ("canary Service missing", _without_kind("Service", "model-server-canary"),
     "canaryService 'model-server-canary' is not a Service"),
    ("scaler target missing", lambda rs: _edit(rs, "ScaledObject", lambda p: p["spec"][
        "scaleTargetRef"].update(name="model-servr")), "scales Rollout mlp-serving/model-servr"),
]


@pytest.mark.parametrize(("what", "mutate", "expected"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_delivery_check_catches(runs: dict[str, Run], what: str,
                                mutate: Callable[[list[Resource]], list[Resource]], expected: str) -> None:
    assert _delivery(runs["dev"].resources) == []
    found = _delivery(mutate(runs["dev"].resources))
    assert any(expected in m for m in found), found


# --- config at the edge -----------------------------------------------------------------------

def _refused(patch: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as err:
        run_program("dev", patch=patch, layers=("platform",))
    return str(err.value)


@pytest.mark.parametrize(("patch", "expected"), [
    ({"mlplatform:serving": {"autoscaling": {"minReplicas": 1}}},
     "mlplatform:serving.autoscaling: Value error, minReplicas is 1"),
    ({"mlplatform:serving": {"rollout": {"steps": [50, 25]}}},
     "mlplatform:serving.rollout.steps: Value error, [50, 25]: canary weights must increase"),
    ({"mlplatform:serving": {"model": {"name": "Bad_Name"}}}, "mlplatform:serving.model.name"),
    ({"mlplatform:serving": {"modelName": "x"}},
     "mlplatform:serving.modelName: unknown key"),
    ({"mlplatform:observability": {"installPrometheusStack": False}},
     "serving needs observability.installPrometheusStack: true"),
    ({"mlplatform:tracking": {"replicas": 1}}, "mlplatform:tracking: Value error, replicas is 1"),
    ({"mlplatform:tracking": {"image": {"repository": "ghcr.io/x/mlflow", "tag": "3.17.2"}}},
     "image must be pinned by digest"),
    ({"mlplatform:tracking": {"role": "controlplane"}}, "belong to the control plane"),
    ({"mlplatform:registry": {"repositories": ["controlplane", "gameday", "tracking"]}},
     "serving.image is required unless registry.repositories lists 'serving'"),
])
def test_bad_serving_or_tracking_config_is_refused_naming_the_key(patch: dict, expected: str) -> None:
    message = _refused(patch)
    assert "Pulumi.dev.yaml" in message and expected in message, message


@pytest.mark.parametrize("key", ["serving", "tracking"])
def test_application_stack_without_the_serving_digest_says_what_to_do(key: str) -> None:
    """`gameday infra image` builds the serving and tracking targets: the message sends the
    user there, and names how to deploy without them."""
    with pytest.raises(ConfigError, match=(
            rf"mlplatform:images.{key} is not set in Pulumi.dev-app.yaml: build and push the "
            rf"image first \(`gameday infra image --stack dev` builds the Dockerfile's `{key}` "
            rf"target and records its digest\), then run this stack; or remove mlplatform:{key} "
            r"from Pulumi.dev.yaml to deploy without it")):
        # check_images runs before the platform stack's outputs are read: no platform run needed
        run_program("dev", app_patch={"mlplatform:images": {key: None}}, layers=("application",))


@pytest.mark.parametrize(("model", "expected"), [
    (None, (r"mlplatform:servedModel is not set in Pulumi.dev-app.yaml: publish the model "
           r"\(models/fraud-score/<version>/model.json")),
    ({"version": "v2", "sha256": "abc"}, r"mlplatform:servedModel.sha256: String should match"),
    ({"version": "v2", "sha256": None}, r"mlplatform:servedModel.sha256: Field required"),
])
def test_application_stack_names_the_served_model_it_lacks(model: Any, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        run_program("dev", app_patch={"mlplatform:servedModel": model})


def test_the_served_version_is_the_canary() -> None:
    """The application stack's servedModel reaches the server (version, digest) and the golden
    set's analysis (its version argument)."""
    run = run_program("dev", app_patch={"mlplatform:servedModel": {"version": "v2", "sha256": "a" * 64}},
                      layers=("platform", "application"))
    rollout = _one(run, "Rollout", "model-server")
    args = rollout["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--version") + 1] == "v2" and args[args.index("--sha256") + 1] == "a" * 64
    step = next(s["analysis"] for s in rollout["spec"]["strategy"]["canary"]["steps"] if "analysis" in s)
    assert step["args"] == [{"name": "model-version", "value": "v2"}]


def test_stacks_without_serving_or_tracking_declare_neither() -> None:
    run = run_program("dev", patch={"mlplatform:serving": None, "mlplatform:tracking": None})
    types = {r.type for r in run.resources}
    assert not {"mlplatform:infra:Serving", "mlplatform:infra:Tracking",
                "mlplatform:infra:DeliveryAddons"} & types
    assert set(run.exports["dev"][out.ROLE_ARNS]).isdisjoint(
        {out.SERVING_ROLE, out.TRACKING_ROLE, out.TRACKING_DB_ROLE})
    assert d.check_all(run.resources) == [] and rehearse(graph_of(run)) == []
    assert app_stack("dev") in run.exports


def test_a_stack_without_serving_and_tracking_needs_neither_image() -> None:
    """The opt-out the message names: with `serving` and `tracking` removed from the platform
    stack, the application stack deploys without their images or a served model."""
    run = run_program("dev", patch={"mlplatform:serving": None, "mlplatform:tracking": None},
                      app_patch={"mlplatform:images": {"serving": None, "tracking": None},
                                 "mlplatform:servedModel": None})
    kinds = {r.type for r in run.resources}
    assert "kubernetes:argoproj.io/v1alpha1:Rollout" not in kinds
    names = {r.props.get("metadata", {}).get("name") for r in run.of_type(
        "kubernetes:apps/v1:Deployment")}
    assert "controlplane-api" in names and "mlflow" not in names
