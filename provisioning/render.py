"""Run the Pulumi program offline, under Pulumi's mocks, and return what it declares.

No engine, no backend, no cloud: ``set_mocks(..., preview=False)`` + the stack's config via
``set_all_config`` + ``runpy.run_path`` of ``provisioning/__main__.py`` + a mock monitor whose
registrations we read. What it returns is what the program *declares* for a stack, not what
exists: ids, ARNs and other outputs are invented by :class:`OfflineMocks`. Remote components
(pulumi-eks's ``eks:index:Cluster`` / ``ManagedNodeGroup``) are opaque here: they appear as
one resource each, what they create inside does not.

Used by ``gameday infra inventory`` (operations/inventory.py) and by the tests' harness.
"""

from __future__ import annotations

import asyncio
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

from provisioning.config import PROJECT, PROJECT_ROOT

PROGRAM = PROJECT_ROOT / "provisioning" / "__main__.py"
ACCOUNT = "123456789012"
# Digests an application stack is rendered with when its config records none yet (before
# `gameday infra image`): they change no resource, only the image references.
PLACEHOLDER_IMAGES = {"controlplane": "sha256:" + "0" * 64, "gameday": "sha256:" + "1" * 64,
                      "serving": "sha256:" + "2" * 64, "tracking": "sha256:" + "3" * 64}
# Likewise the served model's version and digest (`mlplatform:servedModel`, set when published).
PLACEHOLDER_MODEL = {"version": "v0", "sha256": "4" * 64}


class RenderError(Exception):
    """The stack cannot be rendered: unknown stack, unreadable file, or the program refused
    the config (the message names the file and the key)."""


class OfflineMocks(pulumi.runtime.Mocks):
    """Invented outputs: each resource echoes its inputs, plus the few outputs the program
    reads from remote components, data sources and the StackReference."""

    def __init__(self, platform_outputs: dict[str, Any] | None = None) -> None:
        # What the application layer's StackReference returns: the platform run's exports.
        self.platform_outputs = platform_outputs or {}

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

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": ACCOUNT, "arn": f"arn:aws:iam::{ACCOUNT}:user/ci",
                    "userId": "ci", "id": ACCOUNT}
        if args.token == "aws:eks/getCluster:getCluster":
            name = args.args["name"]
            return {"name": name, "id": name, "endpoint": f"https://{name}.mock.eks.amazonaws.com",
                    "certificateAuthorities": [{"data": "Q0EK"}]}
        return {}


class OfflineMonitor(MockMonitor):
    """Resource references off: remote components then receive URNs instead of live
    resource objects, which otherwise get deserialized on another event loop (flaky).
    Also remembers each resource's provider reference (``<provider urn>::<id>``), parent and
    dependencies (explicit ``depends_on`` and the resources its Output inputs came from): the
    order the engine would create things in (provisioning/deploy_graph.py)."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.providers: dict[str, str] = {}
        self.parents: dict[str, str] = {}
        self.dependencies: dict[str, tuple[str, ...]] = {}

    def SupportsFeature(self, request: Any) -> Any:
        ok = request.id not in ("outputValues", "resourceReferences")
        return type("SupportsFeatureResponse", (object,), {"hasSupport": ok})

    def GetDeploymentInfo(self, request: Any) -> Any:
        info = super().GetDeploymentInfo(request)
        return resource_pb2.DeploymentInfo(supportedFeatures=[
            f for f in info.supportedFeatures
            if f != resource_pb2.RESOURCE_MONITOR_FEATURE_RESOURCE_REFERENCES
        ])

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)
        if request.provider:
            self.providers[response.urn] = request.provider
        self.parents[response.urn] = request.parent
        deps = set(request.dependencies)
        for prop in request.propertyDependencies.values():
            deps.update(prop.urns)
        self.dependencies[response.urn] = tuple(sorted(deps))
        return response


@dataclass(frozen=True)
class Resource:
    """One declared resource: URN, type token, logical name, inputs (camelCase), the provider
    reference it was registered with ("" = the default provider), its parent's URN and the
    URNs it depends on (``depends_on`` and Output inputs), in registration order."""

    urn: str
    type: str
    name: str
    props: dict[str, Any]
    id: str = ""
    provider: str = ""
    parent: str = ""
    dependencies: tuple[str, ...] = ()

    @property
    def stack(self) -> str:
        return self.urn.split("::")[0].removeprefix("urn:pulumi:")

    @property
    def parent_types(self) -> list[str]:
        return self.urn.split("::")[2].split("$")[:-1]


@dataclass(frozen=True)
class Rendered:
    """Both layers of one environment: the platform stack ``stack`` and its application
    stack; ``configs`` holds the config each was rendered with (stack name -> key -> value)."""

    stack: str
    app_stack: str
    resources: list[Resource]
    exports: dict[str, dict[str, Any]] = field(default_factory=dict)
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)


def app_stack(stack: str) -> str:
    return f"{stack}-app"


def stack_file(stack: str, root: Path = PROJECT_ROOT) -> Path:
    return root / f"Pulumi.{stack}.yaml"


def known_stacks(root: Path = PROJECT_ROOT) -> list[str]:
    """Platform stacks of this checkout: ``Pulumi.<stack>.yaml`` files that are not
    application stacks."""
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in root.glob("Pulumi.*.yaml")
                  if not p.name.endswith("-app.yaml"))


def read_stack_config(stack: str, root: Path = PROJECT_ROOT) -> dict[str, Any]:
    """The ``config`` map of ``Pulumi.<stack>.yaml``."""
    path = stack_file(stack, root)
    if not path.is_file():
        raise RenderError(f"unknown stack {stack!r}: {path.name} not found in {root} "
                          f"(known stacks: {', '.join(known_stacks(root)) or 'none'})")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RenderError(f"{path.name}: not valid YAML: {exc}") from exc
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        raise RenderError(f"{path.name}: has no 'config' mapping")
    return config


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Deep merge; a None value in ``patch`` deletes the key."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        elif value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def _encode(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)  # what the engine passes for objects, lists, bools, numbers


def _drain() -> None:
    """After a failed run (an error raised inside an apply), cancel what is still pending on
    its loop and forget the runtime's pending work: left behind, the next mocked run waits on
    it forever."""
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


def run_stack(stack: str, config: dict[str, Any], mocks: OfflineMocks,
              project: str = PROJECT) -> tuple[list[Resource], dict[str, Any]]:
    """Run the program once as ``stack`` with ``config`` (``<ns>:<key>`` -> value) on a
    fresh event loop; returns the registered resources and the stack's exports."""
    # Pulumi's mock runtime uses asyncio.get_event_loop(); an earlier asyncio.run() in the
    # same process leaves the main thread without a loop.
    asyncio.set_event_loop(asyncio.new_event_loop())
    pulumi.runtime.set_all_config({k: _encode(v) for k, v in config.items()})
    pulumi.runtime.settings.set_root_resource(None)  # type: ignore[arg-type]
    monitor = OfflineMonitor(mocks)
    # "organization" is what the engine reports on self-managed backends.
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=monitor,
                             organization="organization")
    exports: dict[str, Any] = {}

    def program() -> None:
        runpy.run_path(str(PROGRAM), run_name="__main__")
        root = pulumi.runtime.settings.get_root_resource()
        outputs = getattr(root, "outputs", {}) or {}
        if outputs:  # resolved before the run ends (run_pulumi_func waits for all RPCs)
            pulumi.Output.all(**outputs).apply(exports.update)

    try:
        # the loop set above is fresh and not running: what pulumi's own test helper does then
        asyncio.get_event_loop().run_until_complete(run_pulumi_func(program))
    except BaseException:
        _drain()
        raise
    resources = [
        Resource(urn=reg.urn, type=reg.urn.split("::")[2].split("$")[-1], name=reg.urn.split("::")[3],
                 props=dict(reg.state), id=reg.id or "",
                 provider=monitor.providers.get(reg.urn, "").rsplit("::", 1)[0],
                 parent=monitor.parents.get(reg.urn, ""),
                 dependencies=monitor.dependencies.get(reg.urn, ()))
        for reg in monitor.get_registered_resources().values()
    ]
    return resources, exports


def render(stack: str, root: Path = PROJECT_ROOT) -> Rendered:
    """Both layers of the environment whose platform stack is ``stack`` (an application
    stack's name is accepted and means its platform stack), from this checkout's files."""
    config = read_stack_config(stack, root)
    platform_ref = config.get(f"{PROJECT}:platformStack")
    if config.get(f"{PROJECT}:layer") == "application":
        if not isinstance(platform_ref, str) or not platform_ref:
            raise RenderError(f"{stack_file(stack, root).name}: {PROJECT}:platformStack is not "
                              "set (an application stack names its platform stack)")
        stack = platform_ref.rsplit("/", 1)[-1]
        config = read_stack_config(stack, root)
    app = app_stack(stack)
    app_config = read_stack_config(app, root)
    images = app_config.get(f"{PROJECT}:images") or {}
    if isinstance(images, dict):
        app_config = {**app_config, f"{PROJECT}:images": {**PLACEHOLDER_IMAGES, **images}}
    app_config.setdefault(f"{PROJECT}:servedModel", PLACEHOLDER_MODEL)
    try:
        platform, platform_exports = run_stack(stack, config, OfflineMocks())
        application, app_exports = run_stack(app, app_config, OfflineMocks(platform_exports))
    except pulumi.RunError as exc:  # the program's own refusals name the file and the key
        raise RenderError(str(exc)) from exc
    return Rendered(stack=stack, app_stack=app, resources=platform + application,
                    exports={stack: platform_exports, app: app_exports},
                    configs={stack: config, app: app_config})
