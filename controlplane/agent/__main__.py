"""``python -m controlplane.agent``: the agent without the ``gameday`` wrapper (tests, debugging)."""

from __future__ import annotations

from controlplane.agent.cli import agent_cmd

if __name__ == "__main__":
    agent_cmd()
