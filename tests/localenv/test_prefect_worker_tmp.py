"""Prefect workers keep their temporary files in the environment's state, not the system's."""

from __future__ import annotations

from pathlib import Path

from environments.local import prefect as pf


def test_worker_temporary_files_go_to_the_environment_state(tmp_path: Path) -> None:
    home = tmp_path / "prefect-home"
    spec = pf.worker_spec(home, "http://127.0.0.1:1/api", pf.WORKERS[0], 1, None)
    tmp = Path(spec.env["TMPDIR"])
    assert tmp.is_dir() and tmp.is_relative_to(home)  # created, and purged with the state
