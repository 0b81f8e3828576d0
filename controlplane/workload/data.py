"""Data at start: a step's datasets (its *sources*) are read from the object store and checked
against their declared sha256 before the workload uses a byte of them (docs/CONTRACTS.md
section 5, "Data at start").

Each source is read as declared, or is unusable with a reason: its object is missing, the store
did not answer, or its bytes are not the declared ones (``sha256 mismatch``). The step's
declared policy (``on_source_unavailable``, controlplane/pipelines/spec.py) decides: ``fail``
(also the rule without a policy) is an explicit start failure naming every bad source;
``degrade`` runs on the sources read as declared when there are at least ``min_sources`` of
them, and the result names each source left out with its reason (:func:`accounting`, written
into COMPLETE.json). Nothing runs on bytes other than the declared ones, and nothing runs on
fewer sources without saying which.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from controlplane import dataset_uri, defects, storage


class DataUnavailable(ValueError):
    """The step cannot start on its data under its policy (the message names the sources)."""


@dataclass(frozen=True)
class SourceRead:
    """One source as read at start: the sha256 of the bytes read (None: nothing was read)
    and why it is unusable (None: read as declared)."""

    name: str
    declared: str
    read: str | None
    reason: str | None


@dataclass(frozen=True)
class SourceOutcome:
    policy: str
    min_sources: int | None
    read: dict[str, str]  # name -> sha256 of the bytes used (the declared one)
    excluded: dict[str, str]  # name -> why it was left out
    run: bool
    reason: str
    declared: dict[str, str] = field(default_factory=dict)  # name -> declared sha256


def check(name: str, declared: str, data: bytes | None, error: str | None = None, *,
          verify: bool = True) -> SourceRead:
    """One source's bytes against its declaration (pure). ``verify=False`` is the seeded
    defect source-digest-unchecked: the digest is computed and recorded, never compared."""
    if data is None:
        return SourceRead(name, declared, None, error or "not read")
    got = storage.sha256_hex(data)
    if verify and got != declared:
        return SourceRead(name, declared, got, f"sha256 mismatch: its bytes changed behind the name "
                          f"(declared {declared[:12]}..., read {got[:12]}..., {len(data)} bytes)")
    return SourceRead(name, declared, got, None)


def decide(policy: str | None, min_sources: int | None, reads: Sequence[SourceRead],
           ) -> SourceOutcome:
    """The declared policy applied to what was read (pure). No policy is ``fail``."""
    pol = policy or "fail"
    good = {r.name: r.read for r in reads if r.reason is None and r.read is not None}
    bad = {r.name: r.reason or "not read" for r in reads if r.reason is not None or r.read is None}
    declared = {r.name: r.declared for r in reads}
    total = len(reads)

    def out(run: bool, reason: str, excluded: dict[str, str]) -> SourceOutcome:
        return SourceOutcome(pol, min_sources, good if run else {}, excluded, run, reason,
                             declared)

    if not bad:
        return out(True, f"all {total} sources read as declared", {})
    names = ", ".join(f"{n} ({why})" for n, why in sorted(bad.items()))
    if pol == "fail":
        return out(False, f"policy fail: {len(bad)} of {total} sources unusable: {names}", bad)
    if pol == "degrade":
        floor = min_sources if min_sources is not None else total
        if len(good) >= floor:
            return out(True, f"policy degrade: {len(good)} of {total} sources read, excluded "
                       f"{names}", bad)
        return out(False, f"policy degrade: {len(good)} of {total} sources read, fewer than "
                   f"min_sources {floor}; unusable: {names}", bad)
    raise ValueError(f"unknown source policy {pol!r}")


def accounting(outcome: SourceOutcome) -> dict[str, Any]:
    """What COMPLETE.json records of the sources (``sources``): every declared source, those
    read with the sha256 of the bytes read, each one excluded with its reason."""
    return {"policy": outcome.policy, "min_sources": outcome.min_sources,
            "declared": dict(sorted(outcome.declared.items())),
            "read": dict(sorted(outcome.read.items())),
            "excluded": dict(sorted(outcome.excluded.items()))}


def fetch(get: Callable[[str], bytes], datasets: Sequence[dict[str, Any]],
          policy: dict[str, Any] | None, *, bucket: str,
          ) -> tuple[SourceOutcome, dict[str, bytes]]:
    """Read every dataset with a uri through ``get`` (object keys of the artifact ``bucket``)
    and apply the policy; DataUnavailable when the step may not run. Returns the outcome and
    the bytes of the sources it may use."""
    verify = not defects.enabled("source-digest-unchecked")
    reads: list[SourceRead] = []
    blobs: dict[str, bytes] = {}
    for ds in datasets:
        if not ds.get("uri"):
            continue
        try:
            key = dataset_uri.key_in(ds["uri"], bucket)
        except ValueError as exc:  # e.g. another bucket: not one this workload reads
            reads.append(check(ds["name"], ds["sha256"], None, f"uri {ds['uri']}: {exc}"))
            continue
        try:
            data = get(key)
        except storage.ObjectMissing:
            reads.append(check(ds["name"], ds["sha256"], None, f"object missing: {ds['uri']}"))
            continue
        except storage.StorageUnavailable:
            raise  # the whole store is down: transient, retried (artifact-store-unavailable)
        except storage.StorageError as exc:
            reads.append(check(ds["name"], ds["sha256"], None,
                               f"unreadable: {type(exc).__name__}: {str(exc)[:160]}"))
            continue
        r = check(ds["name"], ds["sha256"], data, verify=verify)
        reads.append(r)
        if r.reason is None:
            blobs[ds["name"]] = data
    policy = policy or {}
    outcome = decide(policy.get("policy"), policy.get("min_sources"), reads)
    if not outcome.run:
        raise DataUnavailable(outcome.reason)
    return outcome, {n: b for n, b in blobs.items() if n in outcome.read}
