"""Node-local checkpoints: the training job's checkpoints on the host's own disk first.

Real training platforms write each checkpoint to the node's local disk (fast NVMe) and upload
only some of them to the object store (tiered checkpointing); a job restarted on the same node
resumes from the local copy. That copy is only worth what its disk kept: after a power loss the
writes that were never fsynced are gone, so the local copy is used only when its bytes verify
against checksums recorded durably elsewhere (the object store's local-checkpoint record,
controlplane/storage.py ``write_local_record``), which the job writes only once the bytes are
durable.

Layout under the node's checkpoint directory (``--local-checkpoint-dir``,
``$CONTROLPLANE_CHECKPOINT_DIR``)::

    <operation_id>/slot-0/{optimizer.npz,state.json,weights.npy}
    <operation_id>/slot-1/...

Two slots, alternating per checkpoint and overwritten in place, so the previous checkpoint is
never touched while the next one is written (no rename: ``state.json`` of a slot names the
step its files claim to be; only the record says whether the bytes are that step's).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from controlplane import defects

SLOTS = 2
ENV = "CONTROLPLANE_CHECKPOINT_DIR"


def slot_of(step: int, every: int) -> int:
    """The slot of the checkpoint at ``step``: consecutive checkpoints alternate."""
    return (step // every) % SLOTS


def _fsync_path(path: Path, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Slot:
    """What a slot holds now: its files as read (a file missing is absent) and the step its
    ``state.json`` claims (None when unreadable)."""
    name: str
    files: dict[str, bytes]
    claimed_step: int | None


class LocalCheckpoints:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def op_dir(self, operation_id: str) -> Path:
        return self.root / operation_id

    def write(self, operation_id: str, slot: int, files: Mapping[str, bytes],
              sync_delay: float = 0.0) -> str:
        """Write the checkpoint's files over the slot's, then make them durable: each file
        fsynced in name order, then the slot's directory. ``sync_delay`` is the time the last
        file waits for its fsync (a slow disk: its bytes are written but not yet durable while
        the earlier files already are). Returns the slot's name."""
        op_dir = self.op_dir(operation_id)
        path = op_dir / f"slot-{slot}"
        fresh = not path.exists()
        path.mkdir(parents=True, exist_ok=True)
        names = sorted(files)
        for name in names:
            fd = os.open(path / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(files[name])
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        sync = not defects.enabled("checkpoint-no-fsync")  # SEEDED DEFECT: never fsynced
        for i, name in enumerate(names):
            if i == len(names) - 1 and sync_delay > 0:
                time.sleep(sync_delay)
            if sync:
                _fsync_path(path / name)
        if sync:
            _fsync_path(path, directory=True)
            if fresh:  # the slot's own name, and the operation's directory in the root
                _fsync_path(op_dir, directory=True)
                _fsync_path(self.root, directory=True)
        return path.name

    def slots(self, operation_id: str, names: tuple[str, ...]) -> list[Slot]:
        """Every slot of the operation with what it holds now (nothing is verified here)."""
        out = []
        for i in range(SLOTS):
            path = self.op_dir(operation_id) / f"slot-{i}"
            files: dict[str, bytes] = {}
            for name in names:
                try:
                    files[name] = (path / name).read_bytes()
                except (FileNotFoundError, NotADirectoryError):
                    continue
            claimed = None
            try:
                claimed = int(json.loads(files["state.json"])["step"])
            except (KeyError, ValueError, TypeError):
                pass
            if files:
                out.append(Slot(path.name, files, claimed))
        return out
