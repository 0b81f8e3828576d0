"""Run the Pulumi program offline under mocks and return what it registered.

Pattern measured in docs/DESIGN.md section 8.10: ``set_mocks(..., preview=False)`` + config via
``set_all_config`` + ``runpy.run_path`` (fresh per stack) + a MockMonitor whose registered
resources we read. Remote components (eks.Cluster, ManagedNodeGroup, helm Chart) are opaque
under mocks, so ``PlatformMocks`` returns their outputs itself.
"""

from __future__ import annotations

import copy
import json
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "infra" / "__main__.py"
PROJECT = "mlplatform"
ACCOUNT = "123456789012"


class PlatformMocks(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        name, state = args.name, dict(args.inputs)
        if args.typ == "pulumi:pulumi:StackReference":
            return f"{name}-id", {"name": state.get("name", name),
                                  "outputs": copy.deepcopy(self.platform_outputs),
                                  "secretOutputNames": []}
        state.setdefault("arn", f"arn:aws:mock:eu-west-1:{ACCOUNT}:{args.typ.split(':')[1]}/{name}")
        extra: dict[str, Any] = {
            "eks:index:Cluster": {
                "kubeconfigJson": "{}",
                "oidcProviderArn": f"arn:aws:iam::{ACCOUNT}:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/MOCK",
                "oidcProviderUrl": "oidc.eks.eu-west-1.amazonaws.com/id/MOCK",
                "clusterSecurityGroupId": "sg-cluster",
            },
            "aws:rds/instance:Instance": {
                "address": f"{name}.mock.rds.amazonaws.com",
                "masterUserSecrets": [{"secretArn": f"arn:aws:secretsmanager:eu-west-1:{ACCOUNT}:secret:rds!{name}",
                                       "kmsKeyId": "k", "secretStatus": "active"}],
            },
            "aws:ecr/repository:Repository": {
                "repositoryUrl": f"{ACCOUNT}.dkr.ecr.eu-west-1.amazonaws.com/{state.get('name', name)}"},
            "aws:s3/bucket:Bucket": {"bucket": name},
            "aws:kms/key:Key": {"keyId": f"key-{name}"},
            "aws:iam/role:Role": {"name": name},
        }.get(args.typ, {})
        for key, value in extra.items():
            state.setdefault(key, value)
        return f"{name}-id", state

    def __init__(self, platform_outputs: dict[str, Any] | None = None) -> None:
        # What the application layer's StackReference returns: the platform run's exports.
        self.platform_outputs = platform_outputs or {}

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": ACCOUNT, "arn": f"arn:aws:iam::{ACCOUNT}:user/ci",
                    "userId": "ci", "id": ACCOUNT}
        if args.token == "aws:eks/getCluster:getCluster":
            name = args.args["name"]
            return {"name": name, "id": name, "endpoint": f"https://{name}.mock.eks.amazonaws.com",
                    "certificateAuthorities": [{"data": "Q0EK"}]}
        return {}


class NoRefsMonitor(MockMonitor):
    """Resource references off: remote components then receive URNs instead of live
    resource objects, which otherwise get deserialized on another event loop (flaky)."""

    def SupportsFeature(self, request: Any) -> Any:
        ok = request.id not in ("outputValues", "resourceReferences")
        return type("SupportsFeatureResponse", (object,), {"hasSupport": ok})

    def GetDeploymentInfo(self, request: Any) -> Any:
        info = super().GetDeploymentInfo(request)
        return resource_pb2.DeploymentInfo(supportedFeatures=[
            f for f in info.supportedFeatures
            if f != resource_pb2.RESOURCE_MONITOR_FEATURE_RESOURCE_REFERENCES
        ])


@dataclass(frozen=True)
class Resource:
    urn: str
    type: str
    name: str
    props: dict[str, Any]
    id: str = ""

    @property
    def parent_types(self) -> list[str]:
        return self.urn.split("::")[2].split("$")[:-1]


@dataclass(frozen=True)
class Run:
    """Both layers of one environment: the platform stack ``stack`` and its application
    stack ``<stack>-app`` (resources of both; URNs name the stack each belongs to)."""

    stack: str
    resources: list[Resource]
    exports: dict[str, dict[str, Any]] = field(default_factory=dict)  # stack name -> outputs

    def layer(self, stack: str) -> list[Resource]:
        return [r for r in self.resources if r.urn.startswith(f"urn:pulumi:{stack}::")]

    def of_type(self, type_: str) -> list[Resource]:
        return [r for r in self.resources if r.type == type_]

    def one(self, type_: str, name_contains: str = "") -> Resource:
        found = [r for r in self.of_type(type_) if name_contains in r.name]
        assert len(found) == 1, f"expected one {type_} named *{name_contains}*, got {[r.name for r in found]}"
        return found[0]

    def k8s_objects(self) -> list[Resource]:
        return [r for r in self.resources if r.type.startswith("kubernetes:") and "kind" in r.props]


def stack_config(stack: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text())["config"]


def app_stack(stack: str) -> str:
    return f"{stack}-app"


# Digests the application stack would have recorded after `gameday infra image` (test data).
TEST_IMAGES = {"controlplane": "sha256:" + "0" * 64, "gameday": "sha256:" + "1" * 64}


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        elif value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def _encode(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)  # what the engine passes for objects, lists, bools, numbers


def real_rules_available() -> bool:
    try:
        import slo.rules  # noqa: F401
    except ImportError:
        return False
    return True


# Used only while slo.rules has not landed: one well-formed group so the PrometheusRule is
# still declared and validated structurally. Tests on rule *content* skip in that case.
PLACEHOLDER_RULES = {"groups": [{"name": "placeholder", "rules": [
    {"alert": "Placeholder", "expr": "vector(0) > 1", "for": "1m",
     "labels": {"severity": "page"}, "annotations": {"runbook": "none"}}]}]}


def objectives_for(env: str, recovery_patch: dict[str, dict[str, Any]] | None = None) -> Any:
    """Objectives from the real slo/ specs; rules from slo.rules when it exists.
    ``recovery_patch`` replaces attributes of objectives (e.g. a contradictory RPO)."""
    from infra.slo_source import PlatformObjectives
    from slo.specs import load_specs

    specs = load_specs(env=env)
    if real_rules_available():
        from slo.rules import generate_rules

        rules = generate_rules(specs)
    else:
        rules = PLACEHOLDER_RULES
    recovery = dict(specs.recovery_objectives)
    for fc, changes in (recovery_patch or {}).items():
        recovery[fc] = recovery[fc].model_copy(update=changes)
    return PlatformObjectives(env=env, recovery=recovery, rules=rules)


def run_program(stack: str, patch: dict[str, Any] | None = None, objectives: Any = None,
                app_patch: dict[str, Any] | None = None, layers: tuple[str, ...] = ("platform", "application"),
                ) -> Run:
    """Run infra/__main__.py for the platform stack ``stack`` (config from Pulumi.<stack>.yaml,
    deep-merged with ``patch``; a None value deletes a key), then for its application stack
    (Pulumi.<stack>-app.yaml + ``TEST_IMAGES``, deep-merged with ``app_patch``), whose
    StackReference returns the platform run's exports and whose environment settings are the
    patched platform config. Returns the resources both registered.
    ``objectives`` replaces what slo/ would provide (default: ``objectives_for(stack)``)."""
    import asyncio

    import infra.config
    import infra.slo_source

    chosen = objectives if objectives is not None else objectives_for(stack)
    original = infra.slo_source.load_objectives, infra.config.read_environment_settings
    platform_config = _merge(stack_config(stack), patch or {})
    infra.slo_source.load_objectives = lambda env: chosen  # type: ignore[assignment]
    infra.config.read_environment_settings = lambda name: {  # type: ignore[assignment]
        k.split(":", 1)[1]: v for k, v in _merge(stack_config(name), patch or {}).items()
        if k.startswith(f"{PROJECT}:")}
    try:
        resources: list[Resource] = []
        exports: dict[str, dict[str, Any]] = {}
        if "platform" in layers:
            # Pulumi's mock runtime uses asyncio.get_event_loop(); an earlier asyncio.run() in
            # the same test process (other suites) leaves the main thread without a loop.
            asyncio.set_event_loop(asyncio.new_event_loop())
            found, exports[stack] = _run(stack, platform_config, PlatformMocks())
            resources += found
        if "application" in layers:
            app = app_stack(stack)
            app_config = _merge(_merge(stack_config(app), {f"{PROJECT}:images": TEST_IMAGES}),
                                app_patch or {})
            asyncio.set_event_loop(asyncio.new_event_loop())
            found, exports[app] = _run(app, app_config, PlatformMocks(exports.get(stack, {})))
            resources += found
        return Run(stack=stack, resources=resources, exports=exports)
    finally:
        infra.slo_source.load_objectives, infra.config.read_environment_settings = original  # type: ignore[assignment]


def _drain() -> None:
    """After a failed run (an error raised inside an apply), cancel what is still pending on
    its loop and forget the runtime's pending work: left behind, the next mocked run waits on
    it forever."""
    import asyncio

    loop = asyncio.get_event_loop()
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    settings = pulumi.runtime.settings.SETTINGS
    settings.outputs.clear()
    settings.rpc_manager.rpcs.clear()
    settings.rpc_manager.unhandled_exception = None


def _run(stack: str, config: dict[str, Any], mocks: PlatformMocks) -> tuple[list[Resource], dict[str, Any]]:
    pulumi.runtime.set_all_config({k: _encode(v) for k, v in config.items()})
    pulumi.runtime.settings.set_root_resource(None)  # type: ignore[arg-type]
    monitor = NoRefsMonitor(mocks)
    # "organization" is what the engine reports on self-managed backends.
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=False, monitor=monitor,
                             organization="organization")
    exports: dict[str, Any] = {}

    def program() -> None:
        runpy.run_path(str(PROGRAM), run_name="__main__")
        root = pulumi.runtime.settings.get_root_resource()
        outputs = getattr(root, "outputs", {}) or {}
        if outputs:  # resolved before the run ends (run_pulumi_func waits for all RPCs)
            pulumi.Output.all(**outputs).apply(exports.update)

    try:
        _sync_await(run_pulumi_func(program))
    except BaseException:
        _drain()
        raise
    resources = [
        Resource(urn=reg.urn, type=reg.urn.split("::")[2].split("$")[-1], name=reg.urn.split("::")[3],
                 props=dict(reg.state), id=reg.id or "")
        for reg in monitor.get_registered_resources().values()
    ]
    return resources, exports
