"""Cost math (slo/cost.py) on hand-computable attempts: every expected figure below is worked
out in the comments from the declared prices, not taken from the code's output."""

from __future__ import annotations

from pathlib import Path

import pytest

from slo.cost import AgentCapacity, AttemptUsage, CostInputs, summarize
from slo.prices import PriceError, PriceTable, load_prices

H = 3600.0
# gpu: 8 $/node-hour, 8 vCPUs, 4 accelerators (2 $/accelerator-hour); cpu: 1 $/node-hour, 4 vCPUs
PRICES = PriceTable.model_validate({
    "currency": "USD", "source": "test figures", "path": "test",
    "pools": {
        "gpu": {"instance_type": "g.test", "capacity_type": "spot", "price_per_hour": 8.0,
                "vcpus_per_node": 8, "accelerators_per_node": 4},
        "cpu": {"instance_type": "c.test", "capacity_type": "on-demand", "price_per_hour": 1.0,
                "vcpus_per_node": 4},
    },
})
AGENTS = (AgentCapacity("g1", "gpu", 8, 4), AgentCapacity("c1", "cpu", 4, 0))


def att(op: str, n: int, outcome: str, pool: str | None, start: float, end: float | None, *,
        cpus: float | None = 1, accs: int | None = 0, progress: float | None = None
        ) -> AttemptUsage:
    return AttemptUsage(op, f"{op}-{n}", n, outcome, pool, cpus, accs, start, start, end,
                        progress)


def spot_retry_run() -> CostInputs:
    """op1 (gpu, 1 vCPU + 2 accelerators = share max(1/8, 2/4) = 0.5 node = 4 $/h): attempt 1
    lost after 1 h (spot interruption: lease expired; progress seen until 0.5 h), attempt 2
    succeeded after 1 h. op2 (cpu, 2 vCPUs = 0.5 node = 0.5 $/h) succeeded in 1 h.
    op3 (cpu, 2 vCPUs) failed after 0.5 h. Window 2 h."""
    return CostInputs(
        window_start=0.0, window_end=2 * H,
        attempts=(
            att("op1", 1, "lost", "gpu", 0, H, accs=2, progress=0.5 * H),
            att("op1", 2, "succeeded", "gpu", H, 2 * H, accs=2),
            att("op2", 1, "succeeded", "cpu", 0, H, cpus=2),
            att("op3", 1, "failed", "cpu", 0, 0.5 * H, cpus=2, progress=0.25 * H),
        ),
        operation_states={"op1": "succeeded", "op2": "succeeded", "op3": "failed"},
        agents=AGENTS)


def test_retried_attempt_after_spot_interruption() -> None:
    s = summarize(spot_retry_run(), PRICES)
    assert s.complete
    assert s.operations_completed == 2 and s.operations_not_completed == 1
    # op1 = 4 (lost) + 4 (succeeded); op2 = 0.5 -> 8.5 for 2 completed operations
    assert s.completed_cost == pytest.approx(8.5)
    assert s.cost_per_completed_operation == pytest.approx(4.25)
    assert s.retry_cost == pytest.approx(4.0)  # the lost spot attempt
    assert s.retry_share == pytest.approx(4.0 / 8.5)
    assert s.lost_cost == pytest.approx(4.0)
    assert s.not_completed_cost == pytest.approx(0.25)  # op3: 0.5 h * 0.5 $/h
    assert s.attempt_cost == pytest.approx(8.75)
    # allocation: gpu 1 node * 2 h * 8 $ = 16; cpu 1 node * 2 h * 1 $ = 2
    assert s.allocated_cost == pytest.approx(18.0)
    assert s.all_in_cost_per_completed_operation == pytest.approx(9.0)


def test_accelerator_hours_idle_and_activity_per_pool() -> None:
    s = summarize(spot_retry_run(), PRICES)
    # 4 accelerators * 2 h allocated; held 2 * 1 h + 2 * 1 h; progress 2 * 0.5 h + 2 * 1 h
    assert s.allocated_accelerator_hours == pytest.approx(8.0)
    assert s.held_accelerator_hours == pytest.approx(4.0)
    assert s.progress_accelerator_hours == pytest.approx(3.0)
    assert s.idle_accelerator_hours == pytest.approx(5.0)
    assert s.held_without_progress_accelerator_hours == pytest.approx(1.0)
    assert s.cost_per_progress_accelerator_hour == pytest.approx(16.0 / 3.0)
    gpu = {p.pool: p for p in s.pools}["gpu"]
    assert (gpu.allocated_node_hours, gpu.held_node_hours, gpu.progress_node_hours) == \
        pytest.approx((2.0, 1.0, 0.75))
    assert gpu.activity == pytest.approx(0.5) and gpu.productive == pytest.approx(0.375)
    assert gpu.lost_attempts == 1 and gpu.lost_cost == pytest.approx(4.0)
    assert gpu.capacity_type == "spot"
    cpu = {p.pool: p for p in s.pools}["cpu"]
    # held: op2 0.5 node * 1 h + op3 0.5 node * 0.5 h = 0.75 of 2 node-hours
    assert cpu.activity == pytest.approx(0.375)
    assert cpu.idle_accelerator_hours == 0.0


def test_unpriced_pool_claims_no_total() -> None:
    run = spot_retry_run()
    inputs = CostInputs(
        window_start=0.0, window_end=2 * H,
        attempts=(*run.attempts, att("op4", 1, "succeeded", "tpu", 0, H, accs=1)),
        operation_states={**run.operation_states, "op4": "succeeded"},
        agents=(*AGENTS, AgentCapacity("t1", "tpu", 8, 4)))
    s = summarize(inputs, PRICES)
    assert not s.complete
    assert s.completed_cost is None and s.cost_per_completed_operation is None
    assert s.attempt_cost is None and s.allocated_cost is None
    assert any("'tpu' is not in the price table" in u for u in s.unpriced)
    tpu = {p.pool: p for p in s.pools}["tpu"]
    assert not tpu.priced and tpu.attempt_cost is None and tpu.allocated_cost is None
    # what is known stays known: the priced pools keep their figures
    assert {p.pool: p for p in s.pools}["gpu"].attempt_cost == pytest.approx(8.0)


def test_run_with_no_completed_operations() -> None:
    inputs = CostInputs(
        window_start=0.0, window_end=H,
        attempts=(att("op1", 1, "failed", "cpu", 0, 0.5 * H, cpus=4),),
        operation_states={"op1": "failed"}, agents=AGENTS)
    s = summarize(inputs, PRICES)
    assert s.operations_completed == 0
    assert s.cost_per_completed_operation is None
    assert s.all_in_cost_per_completed_operation is None
    assert s.not_completed_cost == pytest.approx(0.5)  # a whole cpu node for 0.5 h
    assert any("no operation completed" in n for n in s.notes)


def test_running_attempt_has_no_cost_but_holds_its_slots() -> None:
    inputs = CostInputs(
        window_start=0.0, window_end=H,
        attempts=(att("op1", 1, "running", "gpu", 0, None, accs=4, progress=0.25 * H),),
        operation_states={"op1": "running"}, agents=AGENTS)
    s = summarize(inputs, PRICES)
    assert s.running_attempts == 1 and s.operations_in_flight == 1
    assert s.attempt_cost == 0.0  # no finished attempt: the running one is not priced as 0
    assert s.held_accelerator_hours == pytest.approx(4.0)
    assert s.progress_accelerator_hours == pytest.approx(1.0)
    assert any("no end" in n for n in s.notes)


def test_unknown_agents_and_resources_are_not_zero() -> None:
    inputs = CostInputs(
        window_start=0.0, window_end=H,
        attempts=(att("op1", 1, "succeeded", None, 0, H),
                  att("op2", 1, "succeeded", "cpu", 0, H, cpus=None, accs=None)),
        operation_states={"op1": "succeeded", "op2": "succeeded"}, agents=None)
    s = summarize(inputs, PRICES)
    assert s.completed_cost is None and s.allocated_cost is None
    assert s.allocated_accelerator_hours is None and s.idle_accelerator_hours is None
    assert len(s.unpriced) == 2
    assert any("agents were not recorded" in n for n in s.notes)


def test_packaged_price_table_is_valid_and_declared() -> None:
    table = load_prices()
    assert "EXAMPLE" in table.source
    assert {"cpu", "gpu"} <= set(table.pools)


@pytest.mark.parametrize(("text", "field"), [
    (("currency: USD\nsource: x\npools:\n  cpu: {instance_type: a, capacity_type: spot,"
     " price_per_hour: 0, vcpus_per_node: 4}\n"), "pools.cpu.price_per_hour"),
    (("currency: USD\nsource: x\npools:\n  cpu: {instance_type: a, capacity_type: reserved,"
     " price_per_hour: 1, vcpus_per_node: 4}\n"), "pools.cpu.capacity_type"),
    (("currency: USD\nsource: x\npools:\n  cpu: {instance_type: a, capacity_type: spot,"
     " price_per_hour: 1, vcpus_per_node: 4, gpus: 1}\n"), "pools.cpu.gpus"),
    ("currency: USD\npools: {}\n", "source"),
])
def test_price_table_errors_name_file_and_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(PriceError, match=f"{path}: field {field}"):
        load_prices(path)


def test_slots_are_held_from_dispatch_and_idle_until_start() -> None:
    """Dispatched at 0 (the scheduler books the slots), started at 0.5 h, succeeded at 1 h:
    held 1 h, progress 0.5 h, so 0.5 h of held-without-progress per accelerator."""
    a = AttemptUsage("op1", "op1-1", 1, "succeeded", "gpu", 1, 4, 0.0, 0.5 * H, H, None)
    s = summarize(CostInputs(0.0, H, (a,), {"op1": "succeeded"}, AGENTS), PRICES)
    assert s.cost_per_completed_operation == pytest.approx(8.0)  # a whole gpu node for 1 h
    assert s.held_accelerator_hours == pytest.approx(4.0)
    assert s.held_without_progress_accelerator_hours == pytest.approx(2.0)


def test_attempt_without_progress_events_made_no_progress() -> None:
    """A lost attempt with no progress event: its whole held time is idle (no evidence of
    progress is not progress)."""
    a = att("op1", 1, "lost", "gpu", 0, 0.5 * H, accs=2)
    s = summarize(CostInputs(0.0, H, (a,), {"op1": "failed"}, AGENTS), PRICES)
    assert s.progress_accelerator_hours == 0.0
    assert s.held_without_progress_accelerator_hours == pytest.approx(1.0)
    assert s.idle_accelerator_hours == pytest.approx(4.0)  # 4 accelerators * 1 h allocated
