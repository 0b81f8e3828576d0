"""Node-local checkpoints (controlplane/workload/local.py, workload/run.py): durable before
recorded, a resume that verifies the local copy against its record, and the two seeded defects
of the checkpoint-power-loss class. In process, with an in-memory object store."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from controlplane import defects, storage
from controlplane.workload import model
from controlplane.workload.local import LocalCheckpoints, Slot, slot_of
from controlplane.workload.run import RunContext, choose_local, train


class MemoryStore:
    """ObjectStore's interface (put, get, list_prefixes) over a dict."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.on_retry = None
        self.retry = None

    def put(self, key: str, data: bytes) -> None:
        self.objects[key] = bytes(data)

    def get(self, key: str) -> bytes:
        try:
            return self.objects[key]
        except KeyError:
            raise storage.ObjectMissing(key) from None

    def list_prefixes(self, prefix: str) -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))


def _events(capsys: pytest.CaptureFixture[str]) -> list[dict]:
    out = capsys.readouterr().out
    return [json.loads(line[len("@event "):]) for line in out.splitlines()
            if line.startswith("@event ")]


def _with_defect(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(defects, "active", lambda: frozenset({name}))


CONFIG = model.TrainConfig(steps=60, checkpoint_every=10, seed=11)


def _run(store: MemoryStore, op: str, attempt: int, local: LocalCheckpoints | None,
         upload_every: int = 1) -> dict[str, object]:
    ctx = RunContext(op, attempt, store, local=local, upload_every=upload_every)  # type: ignore[arg-type]
    return train(ctx, CONFIG)


def test_slots_alternate() -> None:
    assert [slot_of(s, 10) for s in (10, 20, 30, 40)] == [1, 0, 1, 0]


def test_write_fsyncs_every_file_then_the_directories(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    local = LocalCheckpoints(tmp_path / "ckpt")
    files = {"state.json": b'{"step": 10}', "weights.npy": b"w", "optimizer.npz": b"o"}
    assert local.write("op", 1, files) == "slot-1"
    assert len(synced) == 3 + 3  # three files, the slot, the operation's dir, the root
    synced.clear()
    local.write("op", 1, files)
    assert len(synced) == 3 + 1  # an existing slot: its files and itself
    [slot] = local.slots("op", ("optimizer.npz", "state.json", "weights.npy"))
    assert slot == Slot("slot-1", files, 10)


def test_seeded_defect_checkpoint_no_fsync_never_fsyncs(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _with_defect(monkeypatch, "checkpoint-no-fsync")
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    LocalCheckpoints(tmp_path).write("op", 0, {"state.json": b"{}"})
    assert synced == []


def _record(step: int, files: dict[str, bytes]) -> storage.LocalRecord:
    return storage.LocalRecord(storage.CheckpointRef("op", 1, step),
                               {n: storage.sha256_hex(d) for n, d in files.items()}, False)


def _files(step: int, weights: bytes) -> dict[str, bytes]:
    return {"state.json": json.dumps({"step": step}).encode(), "weights.npy": weights}


def test_choose_local_uses_the_newest_verified_copy_and_names_what_it_skipped() -> None:
    f50, f60 = _files(50, b"w50"), _files(60, b"w60")
    # power lost in the write of step 70 into the slot that held 50: its state.json was
    # durable, its weights not (they are still step 50's)
    torn = Slot("slot-1", {**_files(70, b"w50")}, 70)
    choice = choose_local([_record(60, f60), _record(50, f50)],
                          [Slot("slot-0", f60, 60), torn], newer_than=40)
    assert choice.slot is not None and choice.slot.name == "slot-0"
    assert choice.record is not None and choice.record.ref.step == 60
    assert choice.skipped == ({"step": 70, "slot": "slot-1",
                               "reason": "never recorded: its write did not complete"},)


def test_choose_local_skips_a_recorded_checkpoint_whose_bytes_were_lost() -> None:
    f50, f60 = _files(50, b"w50"), _files(60, b"w60")
    # the record of 60 was written, but its bytes never became durable: the slot went back
    choice = choose_local([_record(60, f60), _record(50, f50)],
                          [Slot("slot-0", _files(40, b"w40"), 40), Slot("slot-1", f50, 50)],
                          newer_than=40)
    assert choice.record is not None and choice.record.ref.step == 50
    assert [s["step"] for s in choice.skipped] == [60]
    assert choice.skipped[0]["record"] == storage.local_record_key("op", 1, 60)
    assert "no local copy" in str(choice.skipped[0]["reason"])
    # everything gone: nothing newer than the store's copy, each loss named
    gone = choose_local([_record(60, f60), _record(50, f50)], [], newer_than=40)
    assert gone.slot is None and [s["step"] for s in gone.skipped] == [60, 50]
    # a changed byte under the right step is a mismatch, not a copy
    bad = choose_local([_record(60, f60)], [Slot("slot-0", _files(60, b"XXX"), 60)], 40)
    assert bad.slot is None and bad.skipped[0]["reason"] == "weights.npy sha256 mismatch in slot-0"
    # the store's newest complete checkpoint is as new: the local copies are not needed
    assert choose_local([_record(60, f60)], [Slot("slot-0", f60, 60)], 60).slot is None


def test_seeded_defect_local_checkpoint_unverified_takes_the_torn_slot() -> None:
    f60 = _files(60, b"w60")
    torn = Slot("slot-1", _files(70, b"w50"), 70)
    choice = choose_local([_record(60, f60)], [Slot("slot-0", f60, 60), torn], 40, verify=False)
    assert choice.slot is torn and choice.record is None and choice.skipped == ()


def test_local_checkpoints_are_sparse_in_the_store_and_the_result_is_unchanged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = MemoryStore()
    plain = _run(store, "plain", 1, None)
    tiered = _run(store, "tiered", 1, LocalCheckpoints(tmp_path), upload_every=3)
    assert tiered["weights_sha256"] == plain["weights_sha256"]
    uploaded = {k.split("/")[3] for k in store.objects
                if k.startswith("checkpoints/tiered/") and k.endswith("MANIFEST.json")}
    assert uploaded == {"step-00000030", "step-00000060"}
    records = storage.local_records(store, "tiered")  # type: ignore[arg-type]
    assert [r.ref.step for r in records] == [60, 50, 40, 30, 20, 10]
    assert [r.uploaded for r in records] == [True, False, False, True, False, False]
    written = [e["data"] for e in _events(capsys) if e["kind"] == "checkpoint_written"]
    assert [(d["step"], d["location"]) for d in written[6:8]] == [(10, "local"), (20, "local")]
    assert written[8]["prefix"] == storage.checkpoint_prefix("tiered", 1, 30)


def _interrupted(tmp_path: Path, store: MemoryStore) -> LocalCheckpoints:
    """A run that wrote its checkpoints up to step 60 (of 60 steps: then artifacts) is
    replayed as an attempt stopped after step 50's checkpoint: its artifacts removed."""
    local = LocalCheckpoints(tmp_path)
    _run(store, "op", 1, local, upload_every=3)
    for key in [k for k in store.objects if k.startswith("artifacts/")
                or "step-00000060" in k]:
        del store.objects[key]
    return local


def test_resume_prefers_the_verified_local_copy(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    store = MemoryStore()
    reference = _run(store, "ref", 1, None)
    local = _interrupted(tmp_path, store)
    capsys.readouterr()
    # slot-0 holds step 60 (never recorded now), slot-1 step 50
    result = _run(store, "op", 2, local, upload_every=3)
    events = _events(capsys)
    [resumed] = [e["data"] for e in events if e["kind"] == "resumed"]
    assert (resumed["from_step"], resumed["source"], resumed["slot"]) == (50, "local", "slot-1")
    assert resumed["verified"] is True
    skipped = [e["data"] for e in events if e["kind"] == "checkpoint_skipped_local"]
    assert [(s["step"], s["slot"]) for s in skipped] == [(60, "slot-0")]
    assert result["weights_sha256"] == reference["weights_sha256"]


def test_resume_falls_back_to_the_store_when_the_local_copies_are_gone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = MemoryStore()
    reference = _run(store, "ref", 1, None)
    local = _interrupted(tmp_path, store)
    for slot in (tmp_path / "op").iterdir():  # the power loss took every unsynced write
        for f in slot.iterdir():
            f.unlink()
    capsys.readouterr()
    result = _run(store, "op", 2, local, upload_every=3)
    events = _events(capsys)
    [resumed] = [e["data"] for e in events if e["kind"] == "resumed"]
    assert (resumed["from_step"], resumed["source"]) == (30, "store")
    skipped = [e["data"] for e in events if e["kind"] == "checkpoint_skipped_local"]
    assert [s["step"] for s in skipped] == [50, 40]  # each recorded checkpoint that was lost
    assert result["weights_sha256"] == reference["weights_sha256"]
