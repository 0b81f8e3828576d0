"""`gameday env up` with a home it cannot write in: one error line naming the path, nothing
started (it was a traceback from mkdir)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from environments.local.cli import env_group


def test_up_below_a_file_is_one_error_line_and_starts_nothing(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    home = tmp_path / "a-file" / "home"
    result = CliRunner().invoke(env_group, ["up", "--home", str(home)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)  # no traceback
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "not a directory" in lines[0] and str(tmp_path) in lines[0]
