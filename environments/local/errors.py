"""One root exception for the local environment; the CLI turns these into clear messages."""

from __future__ import annotations


class EnvError(Exception):
    """Root of every local-environment error."""


class AlreadyRunning(EnvError):
    """A second `up` on an environment that is running."""


class NotRunning(EnvError):
    """The environment (or the component) is not up."""


class UnknownTarget(EnvError):
    """A fault or command named a component that does not exist."""


class ComponentUnhealthy(EnvError):
    """A component did not become healthy in time; carries the tail of its log."""

    def __init__(self, component: str, reason: str, log_tail: str = "") -> None:
        self.component = component
        self.reason = reason
        self.log_tail = log_tail
        message = f"component {component!r} did not become healthy: {reason}"
        if log_tail:
            message += f"\n--- last lines of {component}'s log ---\n{log_tail}"
        super().__init__(message)
