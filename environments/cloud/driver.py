"""The cloud fault driver (``dev`` / ``staging`` / ``prod``): Kubernetes + AWS behind one
:class:`~environments.base.FaultDriver`.

Routing of each primitive (docs/chaos-cloud.md has the details and permissions):

=============================================  ==============================================
primitive                                      mechanism
=============================================  ==============================================
``kill(api-1 | reconciler | agent:<pool>)``    delete one pod, grace 0 (Kubernetes)
``kill(db-primary)``                           ``failover_db()`` (a primary loss on RDS)
``hang`` / ``resume``                          label pods + isolating NetworkPolicy (K8s)
``stop`` / ``start``                           scale Deployment to 0 / recorded replicas
``failover_db()``                              RDS reboot with ForceFailover (AWS)
``artifact_store_unreachable`` / ``restore``   bucket-policy Deny for the platform roles (AWS)
``registry_unreachable`` / ``restore``         workload egress excludes registry CIDRs (K8s)
``withdraw_pool`` / ``restore_pool``           Karpenter pool (``nodePools``, the default
                                               ``nodepool`` mode): NodePool limits to 0 +
                                               delete its NodeClaims / limits back (K8s);
                                               ``cordon``: cordon + drain / uncordon (K8s);
                                               ``nodegroup``: scale the EKS managed node
                                               group to 0 and back (AWS)
``terminate_node(pool)``                       terminate the oldest EC2 instance of the pool,
                                               found by Karpenter's instance tags (or the
                                               node group's) (AWS)
``partition_agent`` / ``heal_agent``           agent egress policy without the API pods (K8s)
``network.add`` / ``network.remove``           a toxic on the agents' route to the API as a
(chaos/gray.py ``add_toxics``)                 Chaos Mesh NetworkChaos (delay, or 100 % loss)
                                               / delete it (K8s; environments/cloud/network_chaos.py)
``zone_outage`` / ``restore_zone``             deny-all network ACL on the zone's subnets,
                                               original associations restored (AWS); cordon
                                               the zone's nodes + delete their pods (K8s);
                                               RDS forced failover when its primary is in
                                               the zone (AWS)
=============================================  ==============================================

Every change with an inverse is recorded in a JSON state file *before* it is made;
:meth:`CloudFaults.restore_all` replays the inverses from that file, so a run that crashed
(or a new process) can still roll back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from chaoslib.exceptions import ActivityFailed

from environments.cloud.aws import AwsFaults, AwsTarget
from environments.cloud.fault_state import FaultState
from environments.cloud.kubernetes import KubernetesFaults, KubeTarget
from environments.cloud.tags import SYSTEM_POOL
from environments.environment_types import ENVIRONMENTS as ALL_ENVIRONMENTS

__all__ = [
    "ENVIRONMENTS",
    "CloudConfigError",
    "CloudFaults",
    "CloudTarget",
    "FaultState",
    "ProdRefused",
]

# the cloud names of the one list of environments (environments/environment_types.py)
ENVIRONMENTS = tuple(name for name, kind in ALL_ENVIRONMENTS.items() if kind == "cloud")
DB_ALIASES = ("db-primary", "primary", "database")
POOL_WITHDRAWAL = ("nodepool", "cordon", "nodegroup")


class CloudConfigError(ActivityFailed):
    """The cloud target description is invalid (names the key and the reason)."""


class ProdRefused(ActivityFailed):
    """Faults against prod need an explicit ``allow_prod=True``."""



@dataclass(frozen=True)
class CloudTarget:
    environment: str
    kube: KubeTarget
    aws: AwsTarget
    # None: ``nodepool`` for a pool Karpenter owns (nodePools), ``cordon`` otherwise.
    pool_withdrawal: str | None = None

    # Keys as `pulumi stack output --json` exports them, plus what the stack does not export.
    KEYS = ("environment", "project", "stack", "region", "clusterName", "kubeconfig", "context",
            "controlPlaneNamespace", "workloadNamespaces", "agentPools", "artifactBucket",
            "artifactBuckets", "databaseIdentifier", "nodePools", "nodeGroups",
            "denyPrincipalArns",
            "registryCidrs", "registryPort", "partitionAllowCidrs", "poolWithdrawal",
            "drainTimeout", "waitTimeout", "pollSeconds", "zoneSubnets", "networkChaosDuration")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], state_dir: Path | None = None) -> CloudTarget:
        """Validate the whole description before anything runs; names derive from
        ``<project>-<stack>`` as provisioning/ names them when the stack does not export them."""
        unknown = sorted(set(cfg) - set(cls.KEYS))
        if unknown:
            raise CloudConfigError(f"cloud target: unknown key(s) {unknown}; known: {list(cls.KEYS)}")
        env = cfg.get("environment")
        if env not in ENVIRONMENTS:
            raise CloudConfigError(f"cloud target: environment {env!r} is not one of {ENVIRONMENTS}")
        if not cfg.get("region"):
            raise CloudConfigError("cloud target: region is required (e.g. eu-west-1)")
        withdrawal = cfg.get("poolWithdrawal")
        if withdrawal is not None and withdrawal not in POOL_WITHDRAWAL:
            raise CloudConfigError(f"cloud target: poolWithdrawal {withdrawal!r} is not one of "
                                   f"{POOL_WITHDRAWAL}")
        prefix = f"{cfg.get('project', 'mlplatform')}-{cfg.get('stack', env)}"
        pools = tuple(cfg.get("agentPools", ("cpu", "gpu")))
        buckets = tuple(cfg.get("artifactBuckets") or ([cfg["artifactBucket"]]
                                                       if cfg.get("artifactBucket") else []))
        # Karpenter NodePools are named after their pool (provisioning/components/autoscaling.py);
        # managed node groups are targeted only when the description names them.
        node_groups = _pool_map(cfg, "nodeGroups", {})
        node_pools = _pool_map(cfg, "nodePools", {p: p for p in pools
                                                  if p != SYSTEM_POOL and p not in node_groups})
        both = sorted(set(node_pools) & set(node_groups))
        if both:
            raise CloudConfigError(f"cloud target: pool(s) {both} are in both nodePools and "
                                   "nodeGroups; a pool is either Karpenter's or a node group")
        kube = KubeTarget(
            namespace=cfg.get("controlPlaneNamespace", "mlp-controlplane"),
            workload_namespaces=tuple(cfg.get("workloadNamespaces", ("mlp-workloads",))),
            agent_pools=pools, agent_name_prefix=prefix, context=cfg.get("context"),
            kubeconfig=_kubeconfig_path(cfg.get("kubeconfig"), state_dir),
            registry_cidrs=tuple(cfg.get("registryCidrs", ())),
            registry_port=int(cfg.get("registryPort", 443)),
            partition_allow_cidrs=tuple(cfg.get("partitionAllowCidrs", ())),
            drain_timeout=int(cfg.get("drainTimeout", 300)),
            node_pools=node_pools,
            network_chaos_duration=_seconds(cfg, "networkChaosDuration", 900),
        )
        aws = AwsTarget(
            region=cfg["region"], cluster_name=cfg.get("clusterName", prefix),
            db_instance_id=cfg.get("databaseIdentifier", f"{prefix}-controlplane"),
            buckets=buckets,
            nodegroups=node_groups,
            nodepools=node_pools,
            # IRSA roles are auto-named "<prefix>-irsa-<sa>-role-<suffix>" by Pulumi.
            deny_principal_arns=tuple(cfg.get("denyPrincipalArns",
                                              (f"arn:aws:iam::*:role/{prefix}-irsa-*",))),
            zone_subnets=_zone_subnets(cfg),
            wait_timeout=float(cfg.get("waitTimeout", 1800)),
            poll_seconds=float(cfg.get("pollSeconds", 15)),
        )
        return cls(environment=env, kube=kube, aws=aws, pool_withdrawal=withdrawal)


def _pool_map(cfg: Mapping[str, Any], key: str, default: dict[str, str]) -> dict[str, str]:
    """``nodePools`` / ``nodeGroups``: pool -> name, never the system pool."""
    value = cfg.get(key, default)
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and k and v for k, v in value.items()):
        raise CloudConfigError(f"cloud target: {key} must map pool names to non-empty names, "
                               f"got {value!r}")
    if SYSTEM_POOL in value:
        raise CloudConfigError(f"cloud target: {key} names the {SYSTEM_POOL!r} pool; it runs the "
                               "control plane and the game day and is never a node-fault target")
    return dict(value)


def _seconds(cfg: Mapping[str, Any], key: str, default: int) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 86_400:
        raise CloudConfigError(f"cloud target: {key} must be whole seconds from 1 to 86400, "
                               f"got {value!r}")
    return value


def _zone_subnets(cfg: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """``zoneSubnets``: availability zone -> subnet ids (optional)."""
    value = cfg.get("zoneSubnets", {})
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, list | tuple) and v
            and all(isinstance(s, str) and s.startswith("subnet-") for s in v)
            for k, v in value.items()):
        raise CloudConfigError(f"cloud target: zoneSubnets must map zones to lists of subnet "
                               f"ids (subnet-...), got {value!r}")
    return {k: tuple(v) for k, v in value.items()}


def _kubeconfig_path(value: Any, state_dir: Path | None) -> str | None:
    """The stack exports the kubeconfig *content* (JSON); chaosk8s needs a file."""
    if value is None:
        return None
    if isinstance(value, Mapping) or str(value).lstrip().startswith(("{", "apiVersion")):
        if state_dir is None:
            raise CloudConfigError("cloud target: an inline kubeconfig needs a state directory")
        path = Path(state_dir) / "kubeconfig.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value) if isinstance(value, Mapping) else str(value))
        path.chmod(0o600)
        return str(path)
    return str(value)


class CloudToxics:
    """The ``network`` part chaos/gray.py asks a driver for: toxics on the agents' route to
    the API as Chaos Mesh NetworkChaos objects (KubernetesFaults does the work). A toxic with
    no NetworkChaos equivalent is refused by ``check`` before anything is created."""

    def __init__(self, k8s: KubernetesFaults) -> None:
        self.k8s = k8s

    def check(self, target: str, toxics: list[Any]) -> None:
        """Refuse the whole list, naming ``toxics[i].<field>``, if one toxic cannot be mapped."""
        for i, toxic in enumerate(toxics):
            self.k8s.check_toxic(target, toxic, f"toxics[{i}]")

    def add(self, target: str, toxic: dict[str, Any]) -> dict[str, Any]:
        return self.k8s.add_network_chaos(target, toxic)

    def update(self, target: str, name: str, *, toxicity: float | None = None,
               attributes: dict[str, Any] | None = None) -> dict[str, Any]:
        raise ActivityFailed(f"change_toxic {target}/{name}: Chaos Mesh refuses changes to a "
                             "NetworkChaos's spec; remove the toxic and add it again")

    def remove(self, target: str, name: str) -> dict[str, Any]:
        return self.k8s.remove_network_chaos(target, name)


class CloudFaults:
    """``FaultDriver`` for dev/staging/prod; see the module docstring for the routing."""

    name = "kubernetes+aws"

    def __init__(self, config: Mapping[str, Any], state_file: Path, *, allow_prod: bool = False,
                 session: boto3.Session | None = None) -> None:
        state_file = Path(state_file)
        self.target = CloudTarget.from_config(config, state_dir=state_file.parent)
        if self.target.environment == "prod" and not allow_prod:
            raise ProdRefused("refusing to inject faults into prod: pass allow_prod=True "
                              "(experiments: configuration allow_prod: true) to confirm")
        self.state = FaultState(state_file)
        self.k8s = KubernetesFaults(self.target.kube, self.state)
        self.aws = AwsFaults(self.target.aws, self.state, session=session)
        self.network = CloudToxics(self.k8s)

    @classmethod
    def from_configuration(cls, configuration: Mapping[str, Any],
                           secrets: Mapping[str, Any] | None = None) -> CloudFaults:
        """Chaos Toolkit ``configuration``: ``cloud_target`` (dict or path to the JSON of
        ``pulumi stack output --json`` plus extra keys), ``cloud_state_file``, ``allow_prod``."""
        raw = configuration.get("cloud_target")
        if isinstance(raw, str):
            raw = json.loads(Path(raw).read_text())
        if not isinstance(raw, Mapping):
            raise CloudConfigError("configuration.cloud_target: a mapping or a JSON file path")
        allow = str(configuration.get("allow_prod", "false")).lower() in ("1", "true", "yes")
        state = Path(configuration.get("cloud_state_file", ".gameday/cloud-faults.json"))
        return cls(raw, state, allow_prod=allow)

    # -- processes / replicas ---------------------------------------------------------------
    def kill(self, target: str) -> dict[str, Any]:
        if target in DB_ALIASES:  # losing the RDS primary = a forced Multi-AZ failover
            return self.aws.failover_db()
        return self.k8s.kill(target)

    def hang(self, target: str) -> dict[str, Any]:
        return self.k8s.hang(target)

    def resume(self, target: str) -> dict[str, Any]:
        return self.k8s.resume(target)

    def stop(self, target: str) -> dict[str, Any]:
        return self.k8s.stop(target)

    def start(self, target: str) -> dict[str, Any]:
        if target in DB_ALIASES:
            return {"target": target, "already": True}  # RDS brings itself back
        return self.k8s.start(target)

    # -- database / dependencies ------------------------------------------------------------
    def failover_db(self, plain_reboot: bool = False) -> dict[str, Any]:
        return self.aws.failover_db(plain_reboot=plain_reboot)

    def artifact_store_unreachable(self) -> dict[str, Any]:
        return self.aws.artifact_store_unreachable()

    def artifact_store_restore(self) -> dict[str, Any]:
        return self.aws.artifact_store_restore()

    def registry_unreachable(self) -> dict[str, Any]:
        return self.k8s.registry_unreachable()

    def registry_restore(self) -> dict[str, Any]:
        return self.k8s.registry_restore()

    # -- capacity / network -----------------------------------------------------------------
    def withdraw_pool(self, pool: str, mode: str | None = None) -> dict[str, Any]:
        karpenter = pool in self.target.aws.nodepools
        mode = mode or self.target.pool_withdrawal or ("nodepool" if karpenter else "cordon")
        if mode not in POOL_WITHDRAWAL:
            raise CloudConfigError(f"withdraw_pool mode {mode!r} is not one of {POOL_WITHDRAWAL}")
        known = {*self.target.aws.nodepools, *self.target.aws.nodegroups,
                 *self.target.kube.agent_pools}
        if pool != SYSTEM_POOL and pool not in known:  # system: the drivers refuse, by name
            raise CloudConfigError(f"withdraw_pool: unknown pool {pool!r}; pools: {sorted(known)}")
        active = self.state.get(f"withdraw_pool:{pool}")
        if active is not None:
            return {"target": pool, "already": True, "mode": active["undo"]["mode"]}
        if mode == "nodepool":
            return self.k8s.withdraw_nodepool(pool)
        if mode == "nodegroup":
            if karpenter:
                raise CloudConfigError(f"withdraw_pool {pool!r}: Karpenter owns this pool "
                                       "(nodePools); there is no node group to scale, use mode "
                                       "nodepool")
            return self.aws.withdraw_pool(pool)
        return self.k8s.withdraw_pool(pool)

    def restore_pool(self, pool: str) -> dict[str, Any]:
        return self._undo(f"withdraw_pool:{pool}") or {"target": pool, "already": True}

    def terminate_node(self, pool: str, instance_id: str | None = None) -> dict[str, Any]:
        return self.aws.terminate_node(pool, instance_id)

    def partition_agent(self, agent: str) -> dict[str, Any]:
        return self.k8s.partition_agent(agent)

    def heal_agent(self, agent: str) -> dict[str, Any]:
        return self.k8s.heal_agent(agent)

    def partition_database(self, component: str) -> dict[str, Any]:
        raise ActivityFailed("partition_database is not implemented by the cloud drivers yet "
                             "(it needs an egress NetworkPolicy from one API pod to the "
                             "database subnets); the experiment runs locally only")

    def heal_database(self, component: str) -> dict[str, Any]:
        return {"target": component, "already": True}

    # -- zones ------------------------------------------------------------------------------
    def zone_outage(self, zone: str) -> dict[str, Any]:
        """The zone's subnets behind a deny-all network ACL, its nodes cordoned and their pods
        deleted, and, when the RDS primary is in that zone, a forced Multi-AZ failover (RDS
        does not fail over because of a network ACL; a real zone loss would make it)."""
        if self.state.get(f"zone_network_acl:{zone}") is not None:
            return {"target": zone, "already": True}
        network = self.aws.zone_outage(zone)
        nodes = self.k8s.zone_outage(zone)
        db = self.aws.failover_db() if self.aws.db_zone() == zone else None
        return {"target": zone, "network": network, "nodes": nodes, "database": db,
                "primary_lost": db is not None}

    def restore_zone(self, zone: str) -> dict[str, Any]:
        nodes = self._undo(f"zone_cordon:{zone}")
        network = self._undo(f"zone_network_acl:{zone}")
        if nodes is None and network is None:
            return {"target": zone, "already": True}
        return {"target": zone, "network": network, "nodes": nodes}


    def drain_node(self, node: str, timeout: float | None = None) -> dict[str, Any]:
        """Cordon + evict through the eviction API (PodDisruptionBudgets honoured; never a
        plain delete); restore_all uncordons."""
        return self.k8s.drain_node(node, timeout)

    # -- all --------------------------------------------------------------------------------
    def _undo(self, key: str) -> dict[str, Any] | None:
        record = self.state.get(key)
        if record is None:
            return None
        fault = record["fault"]
        if fault == "stop":
            return self.k8s.undo_stop(key)
        if fault in ("hang", "partition_agent"):
            return self.k8s.undo_isolation(key)
        if fault == "registry_unreachable":
            return self.k8s.registry_restore()
        if fault == "artifact_store_unreachable":
            return self.aws.artifact_store_restore()
        if fault == "drain_node":
            return self.k8s.undo_drain(key)
        if fault == "withdraw_pool":
            mode = record["undo"]["mode"]
            if mode == "nodepool":
                return self.k8s.undo_withdraw_nodepool(key)
            return (self.aws if mode == "nodegroup" else self.k8s).undo_withdraw(key)
        if fault == "zone_network_acl":
            return self.aws.undo_zone_outage(key)
        if fault == "zone_cordon":
            return self.k8s.undo_zone_outage(key)
        if fault == "network_gray":
            return self.k8s.undo_network_chaos(key)
        raise ActivityFailed(f"state file {self.state.path}: unknown fault {fault!r} ({key})")

    def restore_all(self) -> list[str]:
        """Undo every recorded fault, newest first; keep going past failures, then raise
        naming them (their records stay in the state file for another try)."""
        restored, failed = [], []
        active = self.state.active()
        for key in sorted(active, key=lambda k: active[k]["since"], reverse=True):
            try:
                self._undo(key)
                restored.append(key)
            except Exception as exc:  # noqa: BLE001 - one failed undo must not skip the rest
                failed.append(f"{key}: {exc}")
        if failed:
            raise ActivityFailed(f"restore_all: {len(failed)} fault(s) not undone "
                                 f"(still in {self.state.path}): {'; '.join(failed)}")
        return restored
