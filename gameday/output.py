"""One line to the operator, as the runner prints it (rich markup, no highlighting)."""

from __future__ import annotations

from rich.console import Console


def say(console: Console, msg: str) -> None:
    console.print(msg, highlight=False)
