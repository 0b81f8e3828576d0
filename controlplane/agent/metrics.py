"""Agent Prometheus metrics, on an injectable registry (tests use a fresh one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.info = Info("controlplane_agent", "Agent identity (stable ids for joins)", registry=r)
        self.attempts_running = Gauge("controlplane_agent_attempts_running",
                                      "Attempts this agent is running now", registry=r)
        self.attempts_finished = Counter(
            "controlplane_agent_attempts_finished_total",
            "Attempts this agent finished, by outcome (succeeded, failed, start_failed, "
            "lease_lost, canceled, shutdown)", ["outcome"], registry=r)
        self.slots = Gauge("controlplane_agent_slots", "Capacity slots by kind and state",
                           ["kind", "state"], registry=r)
        self.api_errors = Counter("controlplane_agent_api_errors_total",
                                  "Failed control-plane calls by call and error", ["call", "error"],
                                  registry=r)
        self.claims = Counter("controlplane_agent_claims_total", "Attempts claimed", registry=r)
        self.events_forwarded = Counter("controlplane_agent_events_forwarded_total",
                                        "Workload events forwarded to the control plane", registry=r)
        self.image_resolve_seconds = Histogram(
            "controlplane_agent_image_resolve_seconds", "Image tag -> digest resolution time",
            ["outcome"], registry=r, buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10))
        self.artifact_verify_failures = Counter(
            "controlplane_agent_artifact_verify_failures_total",
            "Succeeded workloads whose artifacts did not verify (reported failed)", registry=r)
        # Evidence accounting (docs/CONTRACTS.md, agent spool): the harness reads these names.
        self.events_dropped = Counter(
            "controlplane_agent_events_dropped_total",
            "Workload events this agent dropped without delivering them, by reason "
            "(spool_full, expired, unreadable)", ["reason"], registry=r)
        self.events_refused = Counter(
            "controlplane_agent_events_refused_total",
            "Spooled workload events the control plane refused (stale fencing token, attempt "
            "no longer active or unknown): seen and refused there, not dropped here", registry=r)
        self.events_spooled = Counter(
            "controlplane_agent_events_spooled_total",
            "Workload events written to the on-disk spool because they could not be delivered",
            registry=r)

    def set_capacity(self, cpu_total: int, cpu_free: int, acc_total: int, acc_free: int) -> None:
        self.slots.labels("cpu", "total").set(cpu_total)
        self.slots.labels("cpu", "free").set(cpu_free)
        self.slots.labels("accelerator", "total").set(acc_total)
        self.slots.labels("accelerator", "free").set(acc_free)
