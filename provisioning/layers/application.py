"""Application layer: what runs in the cluster (Karpenter's controller and NodePools, the GPU
device plugin, the control plane, its charts and monitors, the scheduled game day).

Its AWS values come from the platform stack through a StackReference (``outputs``), its
settings from the platform stack's file (``provisioning.config.load_stack_config``), its images from
the registry at the digests ``gameday infra image`` recorded. It reaches the cluster with a
kubeconfig built from the cluster's endpoint whose token comes from ``gameday infra
kube-token`` (no `aws` CLI); with a private endpoint it must run inside the VPC (the deploy
runner, docs/infra.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from environments.cloud.eks_token import kubeconfig
from provisioning import objectives as obj
from provisioning import slo_source
from provisioning.components.autoscaling import Karpenter
from provisioning.components.common import Naming
from provisioning.components.controlplane import ControlPlane, ControlPlaneInputs
from provisioning.components.delivery import DeliveryAddons
from provisioning.components.nodepools import NvidiaDevicePlugin, pool_labels
from provisioning.components.observability import Observability
from provisioning.components.serving import Serving, ServingInputs
from provisioning.components.tracking import Tracking, TrackingInputs
from provisioning.config import (
    CONTROL_PLANE_REPOSITORY,
    HARNESS_REPOSITORY,
    PROJECT,
    SERVING_REPOSITORY,
    TRACKING_REPOSITORY,
    ApplicationConfig,
    ConfigError,
    ImageConfig,
    StackConfig,
    aws_region,
    check_default_tags,
    load_application_config,
    load_stack_config,
)
from provisioning.layers import outputs as out

KARPENTER_OUTPUT = f"the platform output {out.KARPENTER!r}"


class PlatformOutputError(pulumi.RunError):
    """The platform stack lacks a value this layer needs, or describes another environment."""


def _field(values: Any, key: str, where: str) -> Any:
    if not isinstance(values, Mapping) or key not in values:
        raise PlatformOutputError(
            f"{where} has no {key!r}: run `pulumi up` on the platform stack with this "
            "checkout first (docs/infra.md)")
    return values[key]


def image_reference(configured: ImageConfig | None, repository: str, digest: str | None,
                    key: str, repositories: pulumi.Output[Any]) -> tuple[pulumi.Input[str], str]:
    """(reference, pin): a configured image as is; otherwise the platform registry's
    ``repository`` at the recorded digest (never a tag: what runs is what was built)."""
    if configured is not None:
        return configured.reference, configured.digest or configured.tag or ""
    assert digest is not None, key  # check_images ran before any resource was declared
    where = f"the platform output {out.REPOSITORIES!r}"
    url = repositories.apply(lambda r: _field(r, repository, where))
    return pulumi.Output.concat(url, "@", digest), digest


def check_images(cfg: StackConfig, app: ApplicationConfig) -> None:
    """Every image this stack runs is pinned before anything is declared."""
    needed = {"controlplane": cfg.control_plane.image is None,
              "gameday": cfg.game_day.enabled and cfg.game_day.image is None,
              "serving": cfg.serving is not None and cfg.serving.image is None,
              "tracking": cfg.tracking is not None and cfg.tracking.image is None}
    for key, digest in (("controlplane", app.images.controlplane), ("gameday", app.images.gameday),
                        ("serving", app.images.serving), ("tracking", app.images.tracking)):
        if needed[key] and digest is None:
            # serving and tracking are optional sections: name how to deploy without them
            opt_out = (f"; or remove {PROJECT}:{key} from Pulumi.{app.platform_stack_name}.yaml "
                       "to deploy without it" if key in ("serving", "tracking") else "")
            raise ConfigError(
                f"{PROJECT}:images.{key} is not set in Pulumi.{pulumi.get_stack()}.yaml: build "
                f"and push the image first (`gameday infra image --stack "
                f"{app.platform_stack_name}` builds the Dockerfile's `{key}` target and records "
                f"its digest), then run this stack{opt_out}")
    if cfg.serving is not None and app.served_model is None:
        raise ConfigError(
            f"{PROJECT}:servedModel is not set in Pulumi.{pulumi.get_stack()}.yaml: publish the "
            f"model (models/{cfg.serving.model.name}/<version>/model.json and golden.json in the "
            "artifact bucket), then set {version, sha256} (the sha256 of its model.json)")


def cluster_provider(name: str, cluster_name: pulumi.Input[str], region: str
                     ) -> tuple[k8s.Provider, pulumi.Output[str]]:
    """A Kubernetes provider for the platform's cluster (endpoint and CA read from EKS) and
    its kubeconfig."""
    info = aws.eks.get_cluster_output(name=cluster_name)
    config = pulumi.Output.all(cluster_name, info.endpoint, info.certificate_authorities).apply(
        lambda a: kubeconfig(a[0], a[1], a[2][0]["data"] if isinstance(a[2][0], Mapping)
                             else a[2][0].data, region))
    return k8s.Provider(name, kubeconfig=config, enable_server_side_apply=True), config


def check_environment(cfg: StackConfig, app: ApplicationConfig, exported: Any) -> None:
    if exported != cfg.environment.value:
        raise PlatformOutputError(
            f"{PROJECT}:platformStack {app.platform_stack!r} is environment {exported!r}, but "
            f"Pulumi.{app.platform_stack_name}.yaml in this checkout says "
            f"{cfg.environment.value!r}: deploy the platform stack from this checkout first")


def build() -> None:
    app = load_application_config()
    cfg = load_stack_config()  # the platform stack's file: the environment's settings
    region = aws_region()
    env = cfg.environment
    objectives = slo_source.load_objectives(env.value)
    api_settings = obj.derive_api_settings(objectives["api-replica-loss"], cfg.control_plane.api)
    # Names follow the platform stack (cluster, database, node pools are named after it).
    naming = Naming(pulumi.get_project(), app.platform_stack_name, env.value, cfg.owner,
                    cfg.cost_center, availability=obj.availability_objectives(objectives.recovery),
                    source_stack=pulumi.get_stack())
    check_default_tags({**naming.tags(), "stack": pulumi.get_stack()})
    check_images(cfg, app)
    p = naming.prefix

    platform_name = (app.platform_stack if "/" in app.platform_stack
                     else f"{pulumi.get_organization()}/{pulumi.get_project()}/{app.platform_stack}")
    platform = pulumi.StackReference(platform_name)

    def need(key: str) -> pulumi.Output[Any]:
        assert key in out.REQUIRED_BY_APPLICATION, key  # the contract lists what is read
        # Not require_output: its bare KeyError does not say which stack or what to do.
        where = f"the outputs of the platform stack {platform_name}"
        return platform.outputs.apply(lambda o: _field(o, key, where))

    environment = need(out.ENVIRONMENT).apply(lambda e: check_environment(cfg, app, e) or e)
    cluster_name = pulumi.Output.all(need(out.CLUSTER_NAME), environment).apply(lambda a: a[0])
    repositories = need(out.REPOSITORIES)
    roles = need(out.ROLE_ARNS)
    roles_where = f"the platform output {out.ROLE_ARNS!r}"
    role_arns: dict[str, pulumi.Input[str]] = {
        sa: roles.apply(lambda r, sa=sa: _field(r, sa, roles_where))
        for sa in out.role_names(cfg)
    }
    karpenter_out = need(out.KARPENTER)
    kms_key_arn = need(out.KMS_KEY_ARN)

    image, pin = image_reference(cfg.control_plane.image, CONTROL_PLANE_REPOSITORY,
                                 app.images.controlplane, "controlplane", repositories)
    game_day_image: pulumi.Input[str] | None = None
    if cfg.game_day.enabled:
        game_day_image, _ = image_reference(cfg.game_day.image, HARNESS_REPOSITORY,
                                            app.images.gameday, "gameday", repositories)

    provider, kube_config = cluster_provider(f"{p}-k8s", cluster_name, region)
    pools = {"system": cfg.node_pools.system, "cpu": cfg.node_pools.cpu, "gpu": cfg.node_pools.gpu}
    karpenter = Karpenter(
        f"{p}-karpenter", naming, naming.prefix,
        karpenter_out.apply(lambda k: _field(k, "queueName", KARPENTER_OUTPUT)),
        karpenter_out.apply(lambda k: _field(k, "controllerRoleArn", KARPENTER_OUTPUT)),
        {pool: karpenter_out.apply(
            lambda k, pool=pool: _field(_field(k, "instanceProfiles", KARPENTER_OUTPUT), pool,
                                        f"the platform output '{out.KARPENTER}.instanceProfiles'"))
         for pool in pools if pool != "system"},
        pools, cfg.network.availability_zones, kms_key_arn, provider,
    )
    k8s_opts = pulumi.ResourceOptions(providers={"kubernetes": provider}, depends_on=[karpenter])
    if cfg.node_pools.gpu.needs_device_plugin:
        NvidiaDevicePlugin(f"{p}-nvidia", naming, pool_labels("gpu", cfg.node_pools.gpu),
                           opts=k8s_opts)
    control_plane = ControlPlane(
        f"{p}-cp",
        ControlPlaneInputs(
            cfg=cfg.control_plane, pools=cfg.node_pools, api=api_settings, region=region,
            zones=cfg.network.availability_zones, bucket_name=need(out.ARTIFACT_BUCKET),
            database_address=need(out.DATABASE_ADDRESS),
            database_secret_arn=need(out.DATABASE_SECRET_ARN),
            database_cidrs=need(out.DATABASE_CIDRS), image=image, image_pin=pin,
            game_day_image=game_day_image, role_arns=role_arns,
            tracking_endpoint=(None if cfg.tracking is None
                               else (cfg.tracking.namespace, cfg.tracking.port)),
        ),
        naming,
        opts=k8s_opts,
    )
    observability = Observability(
        f"{p}-obs", naming, objectives.rules, cfg.control_plane.namespace,
        ["reconciler", *(f"agent-{pool}" for pool in cfg.control_plane.agents)],
        cfg.observability.install_prometheus_stack,
        opts=pulumi.ResourceOptions(providers={"kubernetes": provider}, depends_on=[control_plane]),
    )
    if cfg.serving is not None:
        # Argo Rollouts and KEDA (their CRDs) first; the Prometheus stack for the PodMonitor,
        # the autoscaler's query and the analysis; Karpenter for the cpu pool's nodes.
        delivery = DeliveryAddons(f"{p}-delivery", naming, opts=k8s_opts)
        serving_image, _ = image_reference(cfg.serving.image, SERVING_REPOSITORY,
                                           app.images.serving, "serving", repositories)
        assert app.served_model is not None  # check_images ran before any resource
        Serving(f"{p}-serving", ServingInputs(
            cfg=cfg.serving, version=app.served_model, bucket_name=need(out.ARTIFACT_BUCKET),
            region=region,
            image=serving_image, check_image=image, role_arn=role_arns[out.SERVING_ROLE]),
            naming, opts=pulumi.ResourceOptions(providers={"kubernetes": provider},
                                                depends_on=[karpenter, delivery, observability]))
    if cfg.tracking is not None:
        tracking_image, tracking_pin = image_reference(
            cfg.tracking.image, TRACKING_REPOSITORY, app.images.tracking, "tracking", repositories)
        # After the control plane: its External Secrets chart owns the CRDs used here.
        Tracking(f"{p}-tracking", TrackingInputs(
            cfg=cfg.tracking, bucket_name=need(out.ARTIFACT_BUCKET), region=region,
            database_address=need(out.DATABASE_ADDRESS),
            database_secret_arn=need(out.DATABASE_SECRET_ARN), image=tracking_image,
            image_pin=tracking_pin, setup_image=image, setup_pin=pin,
            role_arn=role_arns[out.TRACKING_ROLE], db_reader_role_arn=role_arns[out.TRACKING_DB_ROLE]),
            naming, opts=pulumi.ResourceOptions(providers={"kubernetes": provider},
                                                depends_on=[control_plane]))
    pulumi.export("controlPlaneNamespace", control_plane.namespace)
    pulumi.export("controlPlaneImage", image)
    # Credentials come from `gameday infra kube-token` at use: the kubeconfig holds none.
    pulumi.export("kubeconfig", kube_config)
