"""Routing is pure: property tests prove work never lands on an ineligible destination."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.routing import (
    Destination,
    Outcome,
    PendingReason,
    Requirement,
    image_registry,
    ineligibility,
    route,
)

REGIONS = ["region-1", "region-2", "region-3"]
DATASETS = ["imagenet", "wiki", "audio"]

destinations = st.builds(
    Destination,
    agent_id=st.uuids().map(str), name=st.text("abcdefgh", min_size=1, max_size=6),
    pool=st.sampled_from(["system", "cpu", "gpu"]), zone=st.sampled_from(["zone-a", "zone-b"]),
    region=st.sampled_from(REGIONS), cpu_slots=st.integers(0, 8),
    accelerator_type=st.sampled_from([None, "sim-a100", "sim-h100"]),
    accelerator_count=st.integers(0, 4),
    datasets=st.lists(st.sampled_from(DATASETS), unique=True).map(tuple),
    registries=st.sampled_from([(), ("127.0.0.1:5000",), ("other:5000",)]),
    alive=st.booleans(), breaker_open=st.booleans(), used_cpu=st.integers(0, 8),
    used_accelerators=st.integers(0, 4), waiting=st.integers(0, 3),
    recent_failures=st.integers(0, 3))

requirements = st.builds(
    Requirement, cpu=st.integers(1, 4),
    accelerator_type=st.sampled_from([None, "sim-a100"]), accelerator_count=st.integers(0, 2),
    regions=st.one_of(st.none(), st.lists(st.sampled_from(REGIONS), min_size=1,
                                          unique=True).map(tuple)),
    dataset=st.one_of(st.none(), st.sampled_from(DATASETS)),
    registry=st.sampled_from([None, "127.0.0.1:5000"]))


@settings(max_examples=400)
@given(req=requirements, dests=st.lists(destinations, max_size=8, unique_by=lambda d: d.name))
def test_never_routes_to_an_ineligible_destination(req: Requirement,
                                                   dests: list[Destination]) -> None:
    req = Requirement(**{**req.__dict__, "accelerator_type": req.accelerator_type
                         if req.accelerator_count else None})
    d = route(req, dests)
    if d.outcome is Outcome.DISPATCH:
        assert d.destination is not None
        assert ineligibility(req, d.destination) is None
        assert d.destination.alive and not d.destination.breaker_open
        assert d.destination.free_cpu >= req.cpu
    eligible = [x for x in dests if ineligibility(req, x) is None]
    if not eligible:
        assert d.outcome is Outcome.BLOCKED
        assert d.pending_reason is PendingReason.NO_ELIGIBLE_DESTINATION
    elif not any(x.alive and not x.breaker_open for x in eligible):
        assert d.outcome is Outcome.BLOCKED
        assert d.pending_reason is PendingReason.ELIGIBLE_DESTINATIONS_UNAVAILABLE


def _dest(name: str, **kw: object) -> Destination:
    base = {"agent_id": name, "name": name, "pool": "cpu", "zone": "zone-a", "region": "region-1",
            "cpu_slots": 4, "accelerator_type": None, "accelerator_count": 0, "datasets": (),
            "registries": ()}
    base.update(kw)
    return Destination(**base)  # type: ignore[arg-type]


def test_only_eligible_region_down_blocks_instead_of_moving() -> None:
    req = Requirement(regions=("region-2",), dataset="wiki")
    dests = [_dest("r1", region="region-1", datasets=("wiki",)),
             _dest("r2", region="region-2", datasets=("wiki",), alive=False)]
    d = route(req, dests)
    assert d.outcome is Outcome.BLOCKED
    assert d.pending_reason is PendingReason.ELIGIBLE_DESTINATIONS_UNAVAILABLE
    assert "r2" in d.reason and "not heartbeating" in d.reason
    assert "region region-1 not in allowed" in d.rejected["r1"]


def test_ranking_prefers_healthy_then_short_wait_then_free_capacity() -> None:
    req = Requirement()
    a = _dest("a", recent_failures=2)
    b = _dest("b", waiting=1)
    c = _dest("c", used_cpu=3)
    dd = _dest("d", used_cpu=1)
    assert route(req, [a, b, c, dd]).destination.name == "d"  # type: ignore[union-attr]
    assert route(req, [a, b]).destination.name == "b"  # type: ignore[union-attr]


def test_full_destinations_wait_with_capacity_reason() -> None:
    d = route(Requirement(cpu=2), [_dest("a", used_cpu=3)])
    assert d.outcome is Outcome.WAIT and d.pending_reason is PendingReason.CAPACITY


def test_reserved_and_accelerator_pools() -> None:
    assert "reserved" in (ineligibility(Requirement(), _dest("s", pool="system")) or "")
    gpu = _dest("g", pool="gpu", accelerator_type="sim-a100", accelerator_count=2)
    assert ineligibility(Requirement(), gpu) == "accelerator pool does not take CPU-only work"
    assert ineligibility(Requirement(accelerator_type="sim-a100", accelerator_count=2), gpu) is None
    assert "needs 3" in (ineligibility(Requirement(accelerator_type="sim-a100",
                                                   accelerator_count=3), gpu) or "")


def test_pinned_route_respects_eligibility() -> None:
    req = Requirement(dataset="wiki")
    dests = [_dest("a", datasets=("wiki",)), _dest("b", datasets=("wiki",)), _dest("c")]
    assert route(req, dests, pinned="b").destination.name == "b"  # type: ignore[union-attr]
    blocked = route(req, dests, pinned="c")
    assert blocked.outcome is Outcome.BLOCKED and "dataset wiki not present" in blocked.reason


def test_image_registry() -> None:
    assert image_registry("127.0.0.1:5000/ml/trainer:1.0") == "127.0.0.1:5000"
    assert image_registry("registry.example.com/a/b") == "registry.example.com"
    assert image_registry("ml/trainer:1.0") is None
    assert image_registry("trainer") is None
