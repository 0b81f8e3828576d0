"""Run the Pulumi program offline under mocks and return what it registered.

The offline run itself (mocks, monitor, one stack's run) is the product's renderer,
provisioning/render.py; this module adds what tests need: config patches, objectives replaced,
both layers of an environment in one :class:`Run`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioning.render import (
    ACCOUNT,
    PLACEHOLDER_IMAGES,
    PLACEHOLDER_MODEL,
    OfflineMocks,
    OfflineMonitor,
    Resource,
    app_stack,
    merge,
    read_stack_config,
    run_stack,
)

__all__ = ["ACCOUNT", "PROGRAM", "PROJECT", "REPO", "TEST_IMAGES", "NoRefsMonitor",
           "PlatformMocks", "Resource", "Run", "app_stack", "objectives_for",
           "real_rules_available", "run_program", "stack_config"]

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "provisioning" / "__main__.py"
PROJECT = "mlplatform"
PlatformMocks = OfflineMocks  # the mocks live with the product's offline renderer
NoRefsMonitor = OfflineMonitor


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
    return read_stack_config(stack, REPO)


# Digests the application stack would have recorded after `gameday infra image` (test data).
TEST_IMAGES = PLACEHOLDER_IMAGES


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
    from provisioning.slo_source import PlatformObjectives
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
    """Run provisioning/__main__.py for the platform stack ``stack`` (config from Pulumi.<stack>.yaml,
    deep-merged with ``patch``; a None value deletes a key), then for its application stack
    (Pulumi.<stack>-app.yaml + ``TEST_IMAGES``, deep-merged with ``app_patch``), whose
    StackReference returns the platform run's exports and whose environment settings are the
    patched platform config. Returns the resources both registered.
    ``objectives`` replaces what slo/ would provide (default: ``objectives_for(stack)``)."""
    import provisioning.config
    import provisioning.slo_source

    chosen = objectives if objectives is not None else objectives_for(stack)
    original = provisioning.slo_source.load_objectives, provisioning.config.read_environment_settings
    platform_config = merge(stack_config(stack), patch or {})
    provisioning.slo_source.load_objectives = lambda env: chosen  # type: ignore[assignment]
    provisioning.config.read_environment_settings = lambda name: {  # type: ignore[assignment]
        k.split(":", 1)[1]: v for k, v in merge(stack_config(name), patch or {}).items()
        if k.startswith(f"{PROJECT}:")}
    try:
        resources: list[Resource] = []
        exports: dict[str, dict[str, Any]] = {}
        if "platform" in layers:
            found, exports[stack] = run_stack(stack, platform_config, PlatformMocks())
            resources += found
        if "application" in layers:
            app = app_stack(stack)
            app_config = merge(merge(stack_config(app), {f"{PROJECT}:images": TEST_IMAGES,
                                                         f"{PROJECT}:servedModel": PLACEHOLDER_MODEL}),
                                app_patch or {})
            found, exports[app] = run_stack(app, app_config, PlatformMocks(exports.get(stack, {})))
            resources += found
        return Run(stack=stack, resources=resources, exports=exports)
    finally:
        provisioning.slo_source.load_objectives, provisioning.config.read_environment_settings = original  # type: ignore[assignment]
