"""The images' recipes, checked without a container engine (no Docker daemon runs here, so no
image is built by these tests): the Dockerfile read with BuildKit's own parser (the
`dockerfile` package wraps moby/buildkit's Go parser), its serving and tracking pins equal to
the setup scripts' (what the local environment measured), the serving target shipping every
module its server imports, and the image and deploy buildspecs' shell run by bash with fake
`aws`, `docker` and `pulumi` on PATH."""

from __future__ import annotations

import ast
import hashlib
import os
import re
import shlex
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioning.components import controlplane, serving, tracking
from provisioning.components.deploy_runner import BUILDSPECS
from provisioning.config import ServingConfig, TrackingConfig
from provisioning.deploy_contract import IMAGE_TARGETS
from tests.infra.harness import REPO

BASE = "python:3.11.7-slim-bookworm"  # every stage's base: one pin to bump


@dataclass
class Stage:
    name: str
    base: str  # an image, or an earlier stage's name
    commands: list[Any] = field(default_factory=list)  # dockerfile.Command

    def all(self, cmd: str) -> list[Any]:
        return [c for c in self.commands if c.cmd == cmd]


def stages(commands: Iterable[Any]) -> dict[str, Stage]:
    """The Dockerfile's stages in order, from BuildKit's parse of it."""
    out: dict[str, Stage] = {}
    for command in commands:
        if command.cmd == "FROM":
            image, as_, name = command.value  # every stage is named: FROM <image> AS <name>
            assert as_.upper() == "AS", command.original
            out[name] = Stage(name, image)
        else:
            out[list(out)[-1]].commands.append(command)
    return out


def chain(all_stages: dict[str, Stage], name: str) -> list[Stage]:
    """``name`` and the stages it is built FROM, the base image's side first."""
    found = [all_stages[name]]
    while found[0].base in all_stages:
        found.insert(0, all_stages[found[0].base])
    return found


def pip_installs(stage: Stage) -> list[str]:
    """The requirement specifiers of the stage's ``pip install`` (its ARGs substituted)."""
    args = dict(a.value[0].split("=", 1) for a in stage.all("ARG"))
    found = []
    for run in stage.all("RUN"):
        for part in " ".join(run.value).split("&&"):
            words = shlex.split(part)
            if "pip" in words[0] and words[1:2] == ["install"]:
                found += [re.sub(r"^\$(\w+)$", lambda m: args[m.group(1)], w)
                          for w in words[2:] if not w.startswith("-")]
    return found


def script_installs(script: str, spec_variable: str) -> list[str]:
    """The packages a setup script installs with its pinned ``spec_variable``."""
    text = (REPO / "scripts" / script).read_text()
    pinned = re.search(rf"^{spec_variable}='([^']+)'$", text, re.MULTILINE)
    assert pinned, f"scripts/{script}: no {spec_variable}='...' line"
    line = next(x for x in text.splitlines() if f'"${spec_variable}"' in x and " install " in x)
    words = shlex.split(line.split("2>&1")[0])
    return [pinned.group(1) if w == f"${spec_variable}" else w
            for w in words[words.index("install") + 1:] if not w.startswith("-")]


@pytest.fixture(scope="module")
def df() -> dict[str, Stage]:
    parser = pytest.importorskip(
        "dockerfile", reason="the dev extra's `dockerfile` (BuildKit's Dockerfile parser) is not "
        "installed: pip install -e '.[dev]'")
    return stages(parser.parse_file(str(REPO / "Dockerfile")))


def test_each_target_is_a_stage_on_the_one_pinned_base(df: dict[str, Stage]) -> None:
    names = list(df)
    for target in IMAGE_TARGETS:
        assert target in df, f"Dockerfile has no stage {target!r} (IMAGE_TARGETS)"
    assert {s.base for s in df.values() if s.base not in df} == {BASE}
    for stage in df.values():  # COPY --from names an earlier stage, never a moving image
        for copy in stage.all("COPY"):
            for flag in copy.flags:
                if flag.startswith("--from="):
                    source = flag.split("=", 1)[1]
                    assert source in names[:names.index(stage.name)], copy.original
    assert names[-1] == "controlplane", "a plain `docker build .` makes the control-plane image"


@pytest.mark.parametrize("target", IMAGE_TARGETS)
def test_final_images_run_as_the_pods_user_without_build_tools(
        df: dict[str, Stage], target: str) -> None:
    """Every pod runs as the components' RUN_AS; what is installed is built in a build-*
    stage and copied in, so no pip, compiler or package manager run in the final image."""
    assert serving.RUN_AS == tracking.RUN_AS == controlplane.RUN_AS
    final = chain(df, target)
    users = [u.value[0] for s in final for u in s.all("USER")]
    assert users and users[-1] == f"{serving.RUN_AS}:{serving.RUN_AS}", users
    for stage in final:
        for run in stage.all("RUN"):
            assert not re.search(r"\b(pip|apt-get|apt|gcc|make)\b", " ".join(run.value)), run.original
        for copy in stage.all("COPY"):
            assert any(f.startswith("--from=build-") for f in copy.flags), copy.original


@pytest.mark.parametrize(("build_stage", "script", "variable"), [
    ("build-serving", "setup-kserve.sh", "KSERVE_SPEC"),
    ("build-tracking", "setup-mlflow.sh", "MLFLOW_SPEC"),
])
def test_pins_are_the_setup_scripts(df: dict[str, Stage], build_stage: str, script: str,
                                    variable: str) -> None:
    """One release of KServe and of MLflow: the one the local environment measured. The
    Dockerfile installs what the script installs, pinned the same."""
    installs = pip_installs(df[build_stage])
    assert installs == script_installs(script, variable), f"Dockerfile {build_stage} vs scripts/{script}"
    assert any("==" in spec for spec in installs), installs


def _repo_imports(path: Path) -> set[Path]:
    """The files of this repository that ``path`` imports, directly or not."""
    seen: set[Path] = set()
    todo = [path]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for node in ast.walk(ast.parse(current.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):  # `from pkg import mod` imports pkg.mod
                assert node.level == 0, f"{current}: a relative import"
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                for i in range(1, len(parts) + 1):  # a package's __init__ runs on import too
                    base = REPO.joinpath(*parts[:i])
                    for candidate in (base / "__init__.py", base.with_suffix(".py")):
                        if candidate.is_file():
                            todo.append(candidate)
    return {p.relative_to(REPO) for p in seen}


def test_serving_target_ships_what_its_server_imports(df: dict[str, Stage]) -> None:
    """The serving image copies modules, not the project (kserve's pins would fight the core's):
    each module the server imports, transitively, must be copied under PYTHONPATH."""
    build, final = df["build-serving"], df["serving"]
    pythonpath = dict(zip(*[iter(e.value) for e in final.all("ENV")] * 2, strict=False))
    app = pythonpath.get("PYTHONPATH")
    assert app, "the serving image sets PYTHONPATH to the copied modules"
    shipped: set[Path] = set()
    for copy in build.all("COPY"):
        *sources, dest = copy.value
        for source in sources:
            where = dest + Path(source).name if dest.endswith("/") else dest
            assert where == f"{app}/{source}", f"{copy.original}: {source} lands at {where}"
            path = REPO / source
            shipped |= ({p.relative_to(REPO) for p in path.rglob("*.py")} if path.is_dir()
                        else {Path(source)})
    needed = _repo_imports(REPO / "controlplane" / "serving" / "server.py")
    assert Path("controlplane/serving/server.py") in needed and len(needed) > 2
    assert needed <= shipped, f"not copied into the serving image: {sorted(map(str, needed - shipped))}"
    assert [app in str(c.value) for c in final.all("COPY")].count(True) == 1
    assert tuple(final.all("ENTRYPOINT")[-1].value) == serving.SERVER_COMMAND
    assert final.all("EXPOSE")[-1].value == (str(ServingConfig.model_fields["port"].default),)


def test_tracking_target_runs_mlflow_with_its_driver_and_s3_client(df: dict[str, Stage]) -> None:
    final = chain(df, "tracking")
    assert final[-1].all("ENTRYPOINT")[-1].value == (tracking.MLFLOW,)
    assert final[-1].all("EXPOSE")[-1].value == (str(TrackingConfig.model_fields["port"].default),)
    checks = " ".join(" ".join(r.value) for r in df["build-tracking"].all("RUN"))
    assert 'import psycopg2, boto3, mlflow.server' in checks  # the build fails without them


# --- the buildspecs' shell, with fake tools -------------------------------------------------

FAKE_TOOL = """#!/bin/sh
printf '%s %s\\n' "$(basename "$0")" "$*" >> "$FAKE_LOG"
case "$(basename "$0") $1" in
  "aws ecr") echo registry-password ;;
  "docker login") cat >/dev/null ;;
  "docker inspect") for ref; do :; done; repo=${ref%:*}
    printf '%s@sha256:%s\\n' "$repo" "$(printf '%s' "$repo" | sha256sum | cut -d' ' -f1)" ;;
esac
"""


def _run_phases(tmp_path: Path, spec: str, phases: list[str], env: dict[str, str],
                exported: list[str]) -> tuple[subprocess.CompletedProcess[str], list[str], dict[str, str]]:
    """Run the buildspec's phases in one bash (CodeBuild's `shell: bash`, variables carried
    from command to command); returns the run, the fake tools' calls and the exported values."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for tool in ("aws", "docker", "pulumi"):
        (bindir / tool).write_text(FAKE_TOOL)
        (bindir / tool).chmod(0o755)
    doc = yaml.safe_load((BUILDSPECS / f"{spec}.yml").read_text())
    assert doc["env"]["shell"] == "bash"
    commands = [c for phase in phases for c in doc["phases"][phase]["commands"]]
    out = tmp_path / "exported"
    script = "set -e\n" + "\n".join(commands) + "\n" + "".join(
        f'printf "%s=%s\\n" {v} "${{{v}:-}}" >> "{out}"\n' for v in exported)
    log = tmp_path / "calls"
    done = subprocess.run(["bash", "-c", script], check=False, cwd=tmp_path, text=True,
                          capture_output=True,
                          env={"PATH": f"{bindir}{os.pathsep}/usr/bin:/bin", "FAKE_LOG": str(log),
                               "HOME": str(tmp_path), **env})
    calls = log.read_text().splitlines() if log.exists() else []
    values = dict(line.split("=", 1) for line in out.read_text().splitlines()) if out.exists() else {}
    return done, calls, values


REGISTRY = "123456789012.dkr.ecr.eu-west-1.amazonaws.com"


def _digest(repo: str) -> str:
    return "sha256:" + hashlib.sha256(repo.encode()).hexdigest()


@pytest.mark.parametrize("targets", [
    ("controlplane", "gameday", "serving", "tracking"),
    ("controlplane",),
    ("controlplane", "tracking"),
])
def test_image_buildspec_pushes_and_exports_exactly_the_targets_with_a_repository(
        tmp_path: Path, targets: tuple[str, ...]) -> None:
    exported = yaml.safe_load((BUILDSPECS / "image.yml").read_text())["env"]["exported-variables"]
    repos = {t: f"{REGISTRY}/mlplatform-staging/{t}" for t in targets}
    done, calls, values = _run_phases(
        tmp_path, "image", ["pre_build", "build"],
        {"REGISTRY": REGISTRY, "AWS_REGION": "eu-west-1", "CODEBUILD_BUILD_NUMBER": "7",
         "SOURCE_REVISION": "0123abcd", **{f"REPOSITORY_{t.upper()}": r for t, r in repos.items()}},
        exported)
    assert done.returncode == 0, done.stderr
    tag = "0123abcd-b7"
    assert sorted(calls[:2]) == [  # one pipeline: either may log first
        "aws ecr get-login-password --region eu-west-1",
        f"docker login --username AWS --password-stdin {REGISTRY}"]
    assert calls[2:] == [
        *[line for t in targets for line in (
            f"docker build --target {t} -t {repos[t]}:{tag} .",
            f"docker push {repos[t]}:{tag}",
            f"docker inspect --format {{{{index .RepoDigests 0}}}} {repos[t]}:{tag}")]]
    assert values == {f"IMAGE_DIGEST_{t.upper()}": _digest(repos[t]) if t in repos else ""
                      for t in IMAGE_TARGETS}


@pytest.mark.parametrize("given", [
    ("controlplane",),
    ("controlplane", "serving", "tracking"),
    ("controlplane", "gameday", "serving", "tracking"),
])
def test_deploy_buildspec_sets_the_config_of_each_digest_it_is_given(
        tmp_path: Path, given: tuple[str, ...]) -> None:
    digests = {t: _digest(t) for t in given}
    done, calls, _ = _run_phases(
        tmp_path, "deploy", ["pre_build"],
        {"PULUMI_BACKEND_URL": "s3://state", "APP_STACK": "staging-app",
         **{f"IMAGE_DIGEST_{t.upper()}": d for t, d in digests.items()}}, [])
    assert done.returncode == 0, done.stderr
    assert [c for c in calls if c.startswith("pulumi config set")] == [
        f"pulumi config set --path mlplatform:images.{t} {digests[t]} --stack staging-app"
        for t in IMAGE_TARGETS if t in given]


def test_deploy_buildspec_refuses_to_run_without_the_controlplane_digest(tmp_path: Path) -> None:
    done, calls, _ = _run_phases(tmp_path, "deploy", ["pre_build"],
                                 {"IMAGE_DIGEST_SERVING": _digest("serving")}, [])
    assert done.returncode == 1
    assert "IMAGE_DIGEST_CONTROLPLANE is not set" in done.stderr and calls == []
