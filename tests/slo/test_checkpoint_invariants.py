"""The checkpoint-power-loss invariants (slo/checkpoint_invariants.py) on hand-made evidence:
the healthy resume, and the two seeded defects' shapes (a reported checkpoint lost with the
unsynced writes; a resume from bytes nobody recorded), plus the power-loss helpers of
environments/local/power_loss.py that read the crash report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from environments.local.power_loss import dropped_under
from slo.checkpoint_invariants import (
    durable_resume,
    interrupted,
    power_loss_visible,
    reported_checkpoints_durable,
)
from slo.evidence import Attempt, Event, FaultRecord, StoredObject
from slo.invariants import KNOWN_INVARIANTS
from slo.sli import ObjectIndex, artifact_write_success, checkpoint_progress_loss, ts

T0 = datetime(2026, 12, 6, 6, 0, tzinfo=UTC)
LO, HI = ts(T0), ts(T0 + timedelta(seconds=300))
OP = "op-1"
CRASH = {"dropped_bytes": 4744, "removed_files": [],
         "dropped_files": [{"path": f"/{OP}/slot-1/weights.npy", "bytes": 4744,
                            "truncated": True}]}


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _attempts() -> list[Attempt]:
    return [Attempt(id="a1", operation_id=OP, number=1, state="lost", created_at=_at(1)),
            Attempt(id="a2", operation_id=OP, number=2, state="succeeded", created_at=_at(40))]


def _ev(kind: str, at: float, attempt: str = "a1", **data: Any) -> Event:
    return Event(operation_id=OP, attempt_id=attempt, time=_at(at), kind=kind, data=data)


def _faults(crash: dict[str, Any] | None = CRASH) -> list[FaultRecord]:
    end = {"crash": crash} if crash is not None else {}
    return [FaultRecord(time=_at(30), event="fault_start", fault="power_loss", target="cpu-2"),
            FaultRecord(time=_at(32), event="fault_end", fault="power_loss", target="cpu-2",
                        details=end)]


def _record(step: int, attempt: int = 1) -> StoredObject:
    return StoredObject(key=f"local-checkpoints/{OP}/attempt-{attempt}/step-{step:08d}.json",
                        size=10, content={"files": {}})


def _written(steps: range) -> list[Event]:
    return [_ev("checkpoint_written", 2 + s / 10, step=s, location="local",
                record=f"local-checkpoints/{OP}/attempt-1/step-{s:08d}.json") for s in steps]


def _judge(events: list[Event], objects: list[StoredObject],
           faults: list[FaultRecord] | None = None) -> dict[str, Any]:
    index = ObjectIndex.of(objects)
    faults = _faults() if faults is None else faults
    runs = interrupted(faults, _attempts(), events, index, LO, HI)
    return {"runs": runs,
            "reported": reported_checkpoints_durable(runs, LO, HI),
            "durable": durable_resume(runs, _attempts(), index, LO, HI),
            "visible": power_loss_visible(runs, faults, events, LO, HI)}


def test_the_names_are_known_to_the_specs() -> None:
    assert {"reported-checkpoints-durable", "durable-resume",
            "power-loss-visible"} <= set(KNOWN_INVARIANTS)


def test_the_healthy_resume_passes_all_three() -> None:
    events = [*_written(range(10, 70, 10)),
              _ev("checkpoint_skipped_local", 41, "a2", step=70, slot="slot-1",
                  reason="never recorded: its write did not complete"),
              _ev("resumed", 41, "a2", from_step=60, source="local", slot="slot-0",
                  verified=True),
              _ev("progress", 42, "a2", step=61)]
    out = _judge(events, [_record(s) for s in range(10, 70, 10)])
    [run] = out["runs"]
    assert (run.promised, run.resume is not None) == (60, True)
    for name in ("reported", "durable", "visible"):
        assert out[name].judged == 1 and out[name].violations == (), out[name]
    assert out["reported"].measured == "promised 60, resumed 60"


def test_checkpoint_no_fsync_shape_reported_checkpoint_lost() -> None:
    """The records of 50 and 60 were written, their bytes were not durable: the resume falls
    back to the store's 40 and names what it lost."""
    events = [*_written(range(10, 70, 10)),
              *[_ev("checkpoint_skipped_local", 41, "a2", step=s, reason="no local copy",
                    record=f"local-checkpoints/{OP}/attempt-1/step-{s:08d}.json")
                for s in (60, 50)],
              _ev("resumed", 41, "a2", from_step=40, source="store")]
    objects = [_record(s) for s in range(10, 70, 10)]
    objects += [StoredObject(key=f"checkpoints/{OP}/attempt-1/step-00000040/MANIFEST.json",
                             size=1, content={"files": {}})]
    out = _judge(events, objects)
    assert out["reported"].violations == (
        (f"operation {OP}: resumed from step 40 after the power loss, but step 60 had been "
        "reported durable before it"),)
    assert out["durable"].violations == ()  # 40 is a complete checkpoint of the store
    assert out["visible"].violations == ()  # and the loss of 60 is named
    # unnamed, the same loss is invisible
    silent = [e for e in events if e.kind != "checkpoint_skipped_local"]
    assert "no event names it" in _judge(silent, objects)["visible"].violations[0]


def test_local_checkpoint_unverified_shape_resume_from_unrecorded_bytes() -> None:
    events = [*_written(range(10, 70, 10)),
              _ev("resumed", 41, "a2", from_step=70, source="local", slot="slot-1",
                  verified=False)]
    objects = [_record(s) for s in range(10, 70, 10)]
    out = _judge(events, objects)
    assert out["reported"].violations == ()  # 70 >= 60: nothing reported was lost
    assert out["durable"].violations == (
        (f"operation {OP}: resumed from step 70 of the node's disk (slot-1), which no attempt "
        "recorded as durable"),)
    # a recorded step taken without checking it is a violation too
    unchecked = [*events[:-1], _ev("resumed", 41, "a2", from_step=60, source="local",
                                   slot="slot-0", verified=False)]
    assert "without checking it" in _judge(unchecked, objects)["durable"].violations[0]
    # and the RPO sees a torn checkpoint used
    [loss] = checkpoint_progress_loss(_attempts(), events, 10,
                                      ObjectIndex.of(objects))
    assert loss.torn_checkpoint_used


def test_a_power_loss_without_its_crash_report_is_not_visible() -> None:
    events = [*_written(range(10, 70, 10)),
              _ev("resumed", 41, "a2", from_step=60, source="local", verified=True)]
    out = _judge(events, [_record(s) for s in range(10, 70, 10)], _faults(crash=None))
    assert out["visible"].violations == (("power loss of cpu-2: no crash report (what it "
                                         "dropped) on the fault timeline"),)


def test_nothing_to_judge_is_no_data_never_a_pass() -> None:
    out = _judge(_written(range(10, 70, 10)), [], faults=[])
    for name in ("reported", "durable", "visible"):
        assert out[name].judged == 0 and out[name].no_data, name
    # a loss but nothing ran afterwards (yet)
    assert _judge(_written(range(10, 30, 10)), [])["reported"].no_data


def test_a_node_local_checkpoint_write_is_good_when_its_record_is_in_the_store() -> None:
    [good] = artifact_write_success(_written(range(10, 20, 10)), {"a1": 1},
                                    ObjectIndex.of([_record(10)]))
    assert good.good
    [bad] = artifact_write_success(_written(range(10, 20, 10)), {"a1": 1}, ObjectIndex.of([]))
    assert not bad.good and "without its record" in bad.subject


def test_dropped_under_reads_the_crash_report() -> None:
    report = {"dropped_files": [{"path": "/op-1/slot-1/weights.npy", "bytes": 1},
                                {"path": "/op-2/slot-0/state.json", "bytes": 1}],
              "removed_files": ["/op-1/slot-0/optimizer.npz"]}
    assert dropped_under(report, "op-1") == ["/op-1/slot-0/optimizer.npz",
                                             "/op-1/slot-1/weights.npy"]
    assert dropped_under(report, "op-3") == []
    assert dropped_under({}, "op-1") == []


def test_a_write_is_under_way_while_the_mount_shows_bytes_the_backing_lacks(
        tmp_path: Path) -> None:
    from environments.local.power_loss import write_under_way

    mount, backing = tmp_path / "mnt" / "op", tmp_path / "backing" / "op"
    for root in (mount, backing):
        (root / "slot-1").mkdir(parents=True)
    state70, state50 = b'{"step": 70}', b'{"step": 50}'
    (mount / "slot-1" / "state.json").write_bytes(state70)
    (mount / "slot-1" / "weights.npy").write_bytes(b"w70")
    (backing / "slot-1" / "state.json").write_bytes(state70)  # fsynced
    (backing / "slot-1" / "weights.npy").write_bytes(b"w50")  # not yet
    assert write_under_way(mount, backing, 70) == 70
    assert write_under_way(mount, backing, 80) is None  # not the step asked for
    (backing / "slot-1" / "weights.npy").write_bytes(b"w70")  # the last fsync done
    assert write_under_way(mount, backing, 70) is None
    (backing / "slot-1" / "state.json").write_bytes(state50)
    assert write_under_way(mount, backing, 70) == 70
    assert write_under_way(tmp_path / "none", backing, 1) is None
