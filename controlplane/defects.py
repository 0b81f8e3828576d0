"""Seeded defects: hidden, test-only switches that each break one promise of the control plane.

They exist so the harness can prove that the experiment meant to catch a broken promise does
catch it (`gameday selftest`): a failure class whose experiment passes a broken platform proves
nothing. Switched on by ``CONTROLPLANE_DEFECTS=name[,name]`` in a process's environment (the
local environment sets it per component; never set it in a deployment). Every process with a
defect on logs a warning at start. An unknown name refuses to start: a typo must not silently
test the healthy platform.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from functools import cache

ENV = "CONTROLPLANE_DEFECTS"

# name -> the promise it breaks (what `gameday selftest` prints)
KNOWN: dict[str, str] = {
    "ack-before-commit": "a submission is acknowledged before it is committed",
    "idempotency-ignored": "the same Idempotency-Key creates a new operation",
    "fencing-off": "reports for an attempt whose lease was lost are accepted (no fencing)",
    "torn-checkpoint-resume": "a resume uses the newest checkpoint even without its manifest",
    "ineligible-fallback": "work with no eligible destination is placed on an ineligible one",
    "retries-unbounded": "max_retries is ignored: transient failures are retried forever",
    "success-without-artifacts": "success is reported without a complete completion manifest",
    "readyz-lies": "/readyz answers 200 while the database is unreachable",
    "leases-never-expire": "expired leases are never noticed, so their work never moves",
    "blocked-never-drain": "blocked work is never routed again when capacity returns",
    "lease-from-agent-clock": "a lease is measured from the agent's own clock, not the database's",
    "token-cached-forever": "the agent keeps its first token forever: rotation breaks it",
    "zone-sticky-retry": "a retry is routed only to the zone of its previous attempt",
    "contract-too-early": "the N+1 migration renames a column release N still reads",
    "readyz-needs-telemetry": "/readyz also requires Prometheus: losing telemetry takes the API "
                              "out of service",
    "cache-key-without-data": "a pipeline step's cache key omits its input datasets' digests: "
                              "new bytes under the same name reuse a stale result",
    "registration-without-receipt": "a side effect is recorded without its stable action "
                                    "identity: a retry after a lost response registers twice",
    "release-after-failed-check": "a pipeline's release step runs although an upstream check "
                                  "failed",
    "deadline-beyond-lease": "the agent waits for an API answer longer than its lease: one "
                             "connection that never answers costs the lease",
    "claim-redelivery-skipped": "a claim asked again after its answer was lost (same claim "
                                "id) gets new work instead of what it was granted: the lost "
                                "grant waits on the agent until its lease runs out",
    "verify-starves-lease": "the agent reads its artifacts back on the thread that heartbeats: "
                            "a slow object store lets the lease run out",
    "storage-retry-no-backoff": "a failed object-store call is retried at once, without "
                                "backoff: a throttled store gets a storm of requests",
    "readyz-commit-deadline": "/readyz also commits a write and allows it 100 ms: a slow disk's "
                              "commits take every API replica out of the load balancer",
    "ack-unknown-outcome": "a submission whose commit failed with a lost connection (outcome "
                           "unknown) is acknowledged as if it had committed",
    "admission-unbounded": "admission control is off for user requests: a slow database makes a "
                           "queue without bound, and goodput stays down after the trigger ends",
    "admission-wait-unbounded": "admission control bounds the requests in flight but lets the "
                                "others wait for a slot without limit: a queue without bound "
                                "in front of the slots",
    "checkpoint-no-fsync": "a node-local checkpoint is recorded and reported before its bytes "
                           "are fsynced: a power loss takes checkpoints already reported",
    "local-checkpoint-unverified": "a resume trusts the node's local checkpoint without "
                                   "checking it against its durable record",
    "result-not-read-back": "the agent never reads its artifacts back: it reports success "
                            "with the one file it heard of (the weights) as the result",
    "liveness-ignored": "routing reads every registered agent as alive: work is dispatched "
                        "to agents whose heartbeat expired",
    "revocation-cached": "the API's token cache keeps a token until it expires instead of a "
                         "few seconds: a revoked token stays accepted",
    "agent-revocation-ignored": "the token store ignores the revocation of agent tokens: a "
                                "retired agent token is accepted after it was revoked",
    "source-digest-unchecked": "the workload reads its datasets at start without comparing "
                               "their sha256 with the declared one: it runs on corrupt bytes",
    "excluded-source-unnamed": "a degraded step result is accepted with the names of the "
                               "sources it left out dropped: the pipeline reads as complete "
                               "on fewer sources",
    "tracking-flush-drops-batch": "the workload's tracking sink throws away a batch of metric "
                                  "points whose send failed: points the trainer logged while "
                                  "tracking was away never reach MLflow",
    "tracking-finish-once": "the workload's tracking sink tells MLflow a run ended only once: "
                            "a run that ends while tracking is away stays RUNNING for good",
    "serving-check-liveness": "HAProxy checks a model server's liveness (/v2/health/live) "
                              "instead of its model's readiness: a replica whose model is "
                              "still loading gets predictions",
    "ready-before-loaded": "a model server reports its model ready before the model is "
                           "loaded: the load balancer sends it predictions it cannot answer",
    "rollback-off": "the rollout controller holds a failing canary at its share instead of "
                    "rolling it back: the bad model version keeps answering",
    "canary-weight-ignored": "the rollout controller gives the canary the weight of a full "
                             "share whatever its step: a bad version answers about half the "
                             "predictions before its first analysis ends",
    "serve-partial-model": "a model server whose load failed (the store cut off, a short or "
                           "wrong read) goes ready with the model as far as it got, digest "
                           "unchecked: it answers predictions with weights it never read",
    "scale-up-skips-readiness": "a scale-up enables the new replica in HAProxy forced up, "
                                "without its readiness check: it gets predictions while its "
                                "model is still loading or cannot be read",
}


# name -> the processes whose code carries it (only those need the switch and a restart;
# "migrate" is the schema step a rolling upgrade runs, environments/local/env.py roll_release)
WHERE: dict[str, frozenset[str]] = {
    "ack-before-commit": frozenset({"api"}),
    "idempotency-ignored": frozenset({"api"}),
    "fencing-off": frozenset({"api"}),
    "torn-checkpoint-resume": frozenset({"agent"}),  # the workload inherits its agent's env
    "ineligible-fallback": frozenset({"reconciler"}),
    "retries-unbounded": frozenset({"api", "reconciler"}),
    "success-without-artifacts": frozenset({"agent"}),
    "readyz-lies": frozenset({"api"}),
    "leases-never-expire": frozenset({"reconciler"}),
    "blocked-never-drain": frozenset({"reconciler"}),
    "lease-from-agent-clock": frozenset({"api"}),  # the API trusts the time agents send
    "token-cached-forever": frozenset({"agent"}),
    "zone-sticky-retry": frozenset({"reconciler"}),
    "contract-too-early": frozenset({"migrate"}),  # the schema step of a rolling upgrade
    "readyz-needs-telemetry": frozenset({"api"}),
    "cache-key-without-data": frozenset({"reconciler"}),  # pipeline progression
    "registration-without-receipt": frozenset({"api"}),  # POST .../side-effects
    "release-after-failed-check": frozenset({"reconciler"}),  # pipeline progression
    "deadline-beyond-lease": frozenset({"agent"}),
    "claim-redelivery-skipped": frozenset({"api"}),  # store/agents.py claim
    "verify-starves-lease": frozenset({"agent"}),
    "storage-retry-no-backoff": frozenset({"agent"}),  # the workload inherits its agent's env
    "readyz-commit-deadline": frozenset({"api"}),
    "ack-unknown-outcome": frozenset({"api"}),  # the group commit's error path
    "admission-unbounded": frozenset({"api"}),  # controlplane/api/admission.py policy_from
    "admission-wait-unbounded": frozenset({"api"}),  # admission.py wait_allowance
    "checkpoint-no-fsync": frozenset({"agent"}),  # the workload inherits its agent's env
    "local-checkpoint-unverified": frozenset({"agent"}),  # the workload's resume
    "result-not-read-back": frozenset({"agent"}),  # agent/attempt.py _verify_artifacts
    "liveness-ignored": frozenset({"reconciler"}),  # store/scheduling.py destinations
    "revocation-cached": frozenset({"api"}),  # api/deps.py TokenCache
    "agent-revocation-ignored": frozenset({"api"}),  # store/auth.py lookup
    "source-digest-unchecked": frozenset({"agent"}),  # the workload inherits its agent's env
    "excluded-source-unnamed": frozenset({"reconciler"}),  # store/pipelines.py acceptance
    # the workload's tracking sink (controlplane/workload/tracking.py)
    "tracking-flush-drops-batch": frozenset({"agent"}),
    "tracking-finish-once": frozenset({"agent"}),
    # the generated haproxy.cfg (environments/local/serving.py check_path; HAProxy restarted)
    "serving-check-liveness": frozenset({"haproxy"}),
    "ready-before-loaded": frozenset({"model-server"}),  # serving/server.py StoreModel
    # the local rollout controller (environments/local/serving_rollout.py), no process of its
    # own: it reads the environment's defects (env.json), nothing is restarted. rollback-off in
    # the decision's policy (run), canary-weight-ignored in the weights it sets (set_share)
    "rollback-off": frozenset({"rollout-controller"}),
    "canary-weight-ignored": frozenset({"rollout-controller"}),
    "serve-partial-model": frozenset({"model-server"}),  # serving/server.py StoreModel.load
    # the harness's scale-up (environments/local/serving_scale.py), read from env.json's
    # defects when it enables a replica: no process restarted
    "scale-up-skips-readiness": frozenset({"serving-scale"}),
}


class UnknownDefect(ValueError):
    pass


def parse(value: str | None) -> frozenset[str]:
    names = frozenset(n.strip() for n in (value or "").split(",") if n.strip())
    unknown = sorted(names - KNOWN.keys())
    if unknown:
        raise UnknownDefect(f"{ENV}: unknown defect(s) {unknown}; known: {', '.join(KNOWN)}")
    return names


def for_part(part: str, names: Iterable[str]) -> list[str]:
    """The defects of ``names`` that live in ``part`` (a component kind, or a part of no process
    of its own as WHERE names it), sorted: what that part's process gets in its ENV."""
    return sorted(d for d in names if part in WHERE[d])


@cache
def active() -> frozenset[str]:
    names = parse(os.environ.get(ENV))
    if names:
        logging.getLogger("controlplane.defects").warning(
            "SEEDED DEFECTS ON (test only): %s", ", ".join(sorted(names)),
            extra={"action": "seeded_defects"})
    return names


def enabled(name: str) -> bool:
    if name not in KNOWN:
        raise UnknownDefect(f"no seeded defect named {name!r}")
    return name in active()
