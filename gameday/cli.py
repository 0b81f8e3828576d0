"""`gameday`: the one CLI entry point.

Subcommands live next to the code they drive (``controlplane/cli.py``, ``environments/local/cli.py``,
``slo/cli.py`` ...) and are imported lazily, so ``gameday --help`` stays fast and a heavy
import (Pulumi, boto3) is paid only by the subcommand that needs it.
"""

from __future__ import annotations

import importlib

import click

# name -> (module, attribute, one-line help shown in `gameday --help`)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "controlplane": ("controlplane.cli", "group", "Run the reference ML control plane's processes."),
    "env": ("environments.local.cli", "env_group", "Bring the local environment up/down, status, logs."),
    "fault": ("environments.local.cli", "fault_group", "Inject and revert faults in the local environment."),
    "evaluate": ("slo.cli", "evaluate_cmd", "Recompute SLIs and the gate verdict from a run directory."),
    "history": ("slo.cli", "history_cmd", "List archived game-day runs (run history), newest first."),
    "slo": ("slo.cli", "slo_group", "Validate SLO specs, generate Prometheus rules, render reports."),
    "run": ("gameday.run", "run_cmd", "Run a game day (faults under load) and print the verdict."),
    "gate": ("gameday.run", "gate_cmd", "CI SLO gate: a game day whose exit code gates the pipeline."),
    "validate": ("gameday.suites", "validate_cmd", "Check experiments before a run."),
    "selftest": ("gameday.selftest", "selftest_cmd",
                 "Prove each experiment catches its seeded control-plane defect (test only)."),
    "bench": ("gameday.bench", "bench_group", "Benchmarks that print measured figures."),
    "cost": ("gameday.cost", "cost_group", "Cost per completed run, retries, idle accelerators (declared prices)."),
    "load": ("loadtests.cli", "load_group", "Run Locust load scenarios (ledger + thresholds)."),
    "infra": ("operations.cli", "infra_group",
              "Pulumi stacks: drift, image build and deploy (in-VPC runner), EKS token."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS:
            return None
        module_name, attr, _ = SUBCOMMANDS[cmd_name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                raise click.ClickException(
                    f"subcommand {cmd_name!r} is not available: module {module_name} is missing"
                ) from exc
            # The slim control-plane image installs only the core dependencies.
            raise click.ClickException(
                f"subcommand {cmd_name!r} needs {exc.name!r}, which is not installed: install "
                "the extras it belongs to (pip install 'mlplatform-gameday[harness,infra]', or "
                "the `gameday` image instead of the control-plane one)") from exc
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SUBCOMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mlplatform-gameday")
def main() -> None:
    """Reliability harness for self-hosted ML platforms: provision, attack, measure, gate."""


if __name__ == "__main__":
    main()
