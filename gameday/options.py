"""The options of `gameday run` and `gameday gate`: one `Options` per run, the click options
that build it, the run's home and id, and the exit codes the runner adds to the gate's."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from environments.base import ENVIRONMENTS, RunRequest
from environments.schedule import DEFAULT_FREEZE_FILE
from environments.timeline_metrics import DEFAULT_METRICS_PORT

EXIT_REFUSED = 4  # not started: freeze window, lock held, prod without --allow-prod, bad input
EXIT_INTERRUPTED = 130


@dataclass
class Options:
    env: str = "local"
    env_name: str = "local"
    suite: str = "ci"
    experiments: tuple[str, ...] = ()
    platform: str = "controlplane"
    runs_dir: Path = Path("runs")
    target: Path | None = None
    allow_prod: bool = False
    dry_run: bool = False
    keep_env: bool = True
    load_scenario: str = "gameday"
    freeze_file: Path = DEFAULT_FREEZE_FILE
    home: Path | None = None
    now: datetime | None = None
    archive: str | None = None  # None: slo.archive.default_location(runs_dir)
    no_archive: bool = False
    budget_check: bool = False  # read the touched SLOs' remaining budget first (scheduled runs)
    budget_source: str = "auto"  # auto: the environment's own (EnvironmentKind.budget_source)
    force: bool = False  # run even when the budget check says skip (recorded as forced)
    # fault timeline metrics: 0 = off; None = a free port announced to the local environment's
    # Prometheus, or DEFAULT_METRICS_PORT where nothing reads an announcement
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    # submissions/s of the durability stream (gameday/durability_stream.py); 0 = off
    durability_rate: float = 0.0

    @property
    def request(self) -> RunRequest:
        """What the environment is asked with (environments/base.py)."""
        return RunRequest(env=self.env, env_name=self.env_name, home=self.home,
                          target=self.target, allow_prod=self.allow_prod,
                          platform=self.platform, keep_env=self.keep_env)


def resolve_home(home: Path | None) -> Path:
    """The one home of this run: ``home``, else ``$GAMEDAY_HOME``, else the current directory,
    made absolute once here and handed to every subprocess as it is."""
    return (home or Path(os.environ.get("GAMEDAY_HOME") or os.getcwd())).resolve()


def run_id(opts: Options) -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + f"-{opts.env}-{opts.suite}"


def run_options(f: Any) -> Any:
    """The click options `gameday run` and `gameday gate` share."""
    opts = [
        click.option("--env", "env", default="local", show_default=True,
                     type=click.Choice(list(ENVIRONMENTS)), help="Target environment."),
        click.option("--env-name", default="local", show_default=True,
                     help="Name of the local environment (its state dir under $GAMEDAY_HOME)."),
        click.option("--experiment", "experiments", multiple=True,
                     help="Run only this experiment (repeatable); overrides --suite."),
        click.option("--platform", default="controlplane", show_default=True,
                     help="Platform adapter of the control plane under test."),
        click.option("--runs-dir", type=click.Path(path_type=Path, file_okay=False),
                     default=Path("runs"), show_default=True, help="Where run directories go."),
        click.option("--target", type=click.Path(path_type=Path, dir_okay=False, exists=True),
                     help="Cloud envs (required): target JSON, stack outputs + runner keys "
                          "(docs/chaos-cloud.md, 'Live game days')."),
        click.option("--allow-prod", is_flag=True, help="Allow fault injection into prod."),
        click.option("--dry-run", is_flag=True, help="Print exactly what would be hit; change nothing."),
        click.option("--down-after/--keep-env", "down_after", default=False,
                     help="Take down an environment this run brought up (default: keep it)."),
        click.option("--load-scenario", default="gameday", show_default=True,
                     help="Background load scenario (loadtests/scenarios/NAME.yaml)."),
        click.option("--freeze-file", type=click.Path(path_type=Path, dir_okay=False),
                     default=DEFAULT_FREEZE_FILE, show_default=True,
                     help="Declared freeze windows (no injection inside them)."),
        click.option("--archive", "archive", default=None, metavar="ARCHIVE",
                     help="Run history: directory or s3://bucket/prefix the run is archived to "
                          "and compared with [default: $GAMEDAY_ARCHIVE, else archive/ next to "
                          "--runs-dir]."),
        click.option("--no-archive", is_flag=True,
                     help="Neither archive the run nor compare it with a baseline."),
        click.option("--budget-check/--no-budget-check", "budget_check", default=False,
                     show_default=True,
                     help="First read the remaining error budget of the SLOs the experiments "
                          "touch; skip (exit 5, skipped.json) when one is below the env's "
                          "gate.minRemainingBudget or has no data. Scheduled game days pass it."),
        click.option("--budget-source", type=click.Choice(["auto", "prometheus", "archive"]),
                     default="auto", show_default=True,
                     help="Where the budget check reads: auto = Prometheus for cloud envs "
                          "(the target's prometheusUrl), the archive for local."),
        click.option("--force", is_flag=True,
                     help="Run even when the budget check says skip; the verdict and report "
                          "record that the run was forced."),
        click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
                     show_default=f"a free port for a local environment, {DEFAULT_METRICS_PORT} "
                                  "otherwise",
                     help="Serve the fault timeline as Prometheus metrics on this port during "
                          "the run (0 = off). A local environment's Prometheus is told the "
                          "port whichever it is."),
        click.option("--metrics-addr", default="127.0.0.1", show_default=True,
                     help="Address the fault timeline metrics listen on."),
        click.option("--durability-stream", "durability_rate", type=float, default=0.0,
                     metavar="RATE", show_default=True,
                     help="Also submit RATE cheap operations a second (held queue, no agent) "
                          "through the whole run, so that the durability audit has the events "
                          "to demonstrate its objective: 99.99 % needs 29,956 acknowledged "
                          "with none lost (local, reference control plane; 0 = off)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def build_options(suite: str, **kw: Any) -> Options:
    return Options(env=kw["env"], env_name=kw["env_name"], suite=suite,
                   experiments=tuple(kw["experiments"]), platform=kw["platform"],
                   runs_dir=kw["runs_dir"], target=kw["target"], allow_prod=kw["allow_prod"],
                   dry_run=kw["dry_run"], keep_env=not kw["down_after"],
                   load_scenario=kw["load_scenario"], freeze_file=kw["freeze_file"],
                   home=resolve_home(None), archive=kw["archive"], no_archive=kw["no_archive"],
                   budget_check=kw["budget_check"], budget_source=kw["budget_source"],
                   force=kw["force"], metrics_port=kw["metrics_port"],
                   metrics_addr=kw["metrics_addr"], durability_rate=kw["durability_rate"])
