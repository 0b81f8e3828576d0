"""`gameday infra image` / `gameday infra deploy`: drive the in-VPC deploy runner
(``provisioning/components/deploy_runner.py``) from a checkout.

Both commands package the checkout (``git archive``), upload it to the runner's source bucket
and start a CodeBuild project on it, printing each phase change until the build ends.
``image`` reads the pushed digests from the build's exported variables and writes them to the
application stack's config; ``deploy`` passes them to ``pulumi up`` of that stack.

Pulumi is reached only through :func:`automation_outputs` and :func:`set_app_images` (the
Automation API, which needs the Pulumi CLI); everything else is plain boto3 and git.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from provisioning.config import PROJECT, ConfigError, parse_stack_config
from provisioning.deploy_contract import IMAGE_TARGETS, SOURCE_PREFIX, built_targets

# the CodeBuild exported variable that carries each image's digest (provisioning/buildspecs/image.yml)
DIGEST_VARIABLES = {t: f"IMAGE_DIGEST_{t.upper()}" for t in IMAGE_TARGETS}
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
CONFIG_KEY = "mlplatform:images"  # application stack config: images.<target> (IMAGE_TARGETS)
OUTPUT_KEY = "deployRunner"  # platform stack output (deploy_runner_exports)
TERMINAL = ("SUCCEEDED", "FAILED", "FAULT", "TIMED_OUT", "STOPPED")


class DeployError(Exception):
    """A step of the deploy path failed; the message says which and what to do."""


# --- platform stack outputs ------------------------------------------------------------------

@dataclass(frozen=True)
class Runner:
    image_project: str
    deploy_project: str
    source_bucket: str
    log_group: str
    region: str | None
    app_stack: str
    repositories: dict[str, str]

    @classmethod
    def from_outputs(cls, outputs: Mapping[str, Any], stack: str, source: str,
                     need_runner: bool = True) -> Runner:
        """The runner of ``stack`` from its outputs; with ``need_runner=False`` (a local
        build, e.g. dev with a public endpoint and no runner) only the registry's."""
        repos = outputs.get("repositories") or {}
        repositories = {k: v for k, v in repos.items() if isinstance(v, str)}
        runner = outputs.get(OUTPUT_KEY)
        if not isinstance(runner, Mapping):
            if not need_runner:
                return cls("", "", "", "", _registry_region(repositories), f"{stack}-app",
                           repositories)
            raise DeployError(f"{source}: no '{OUTPUT_KEY}' output: the platform stack {stack} "
                              "has no deploy runner (deployRunner.enabled) or predates it; with a "
                              "public endpoint use `gameday infra image --local` and `pulumi up`")
        missing = [k for k in ("imageProject", "deployProject", "sourceBucket", "logGroup")
                   if not isinstance(runner.get(k), str) or not runner.get(k)]
        if missing:
            raise DeployError(f"{source}: {OUTPUT_KEY} lacks {', '.join(missing)}")
        return cls(runner["imageProject"], runner["deployProject"], runner["sourceBucket"],
                   runner["logGroup"], runner.get("region") or _registry_region(repositories),
                   runner.get("appStack") or f"{stack}-app", repositories)


def _registry_region(repositories: Mapping[str, str]) -> str | None:
    """The region in an ECR repository URL (<account>.dkr.ecr.<region>.amazonaws.com/...)."""
    for url in repositories.values():
        found = re.match(r"^\d+\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com/", url)
        if found:
            return found.group(1)
    return None


def load_outputs_file(path: Path) -> dict[str, Any]:
    """The JSON of ``pulumi stack output --json -s <stack>``."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DeployError(f"{path}: not readable as JSON ({exc}); write it with "
                          "`pulumi stack output --json -s <stack> > FILE`") from exc
    if not isinstance(data, dict):
        raise DeployError(f"{path}: expected a JSON object of stack outputs")
    return data


def automation_outputs(stack: str, work_dir: Path) -> dict[str, Any]:  # pragma: no cover - needs the Pulumi CLI
    """The platform stack's outputs through the Automation API (never run here: no CLI)."""
    from pulumi import automation as auto

    selected = auto.select_stack(stack_name=stack, work_dir=str(work_dir))
    return {k: v.value for k, v in selected.outputs().items()}


def set_app_images(app_stack: str, digests: Mapping[str, str], work_dir: Path) -> None:  # pragma: no cover - needs the Pulumi CLI
    """``pulumi config set --path mlplatform:images.<name> <digest>`` on the application stack
    through the Automation API (never run here: no CLI)."""
    from pulumi import automation as auto

    selected = auto.select_stack(stack_name=app_stack, work_dir=str(work_dir))
    for name, digest in sorted(digests.items()):
        selected.set_config(f"{CONFIG_KEY}.{name}", auto.ConfigValue(value=digest), path=True)


def read_app_images(app_stack: str, work_dir: Path) -> dict[str, str]:
    """The digests in the application stack's config file (``Pulumi.<app>.yaml``), what
    ``set_app_images`` (or ``pulumi config set --path``) wrote there."""
    path = work_dir / f"Pulumi.{app_stack}.yaml"
    try:
        config = (yaml.safe_load(path.read_text()) or {}).get("config") or {}
    except (OSError, yaml.YAMLError) as exc:
        raise DeployError(f"{path}: cannot read the application stack's config ({exc}); "
                          "give --image-digest controlplane=sha256:...") from exc
    images = config.get(CONFIG_KEY) or {}
    return parse_digests(images, f"{path}: {CONFIG_KEY}")


def parse_digests(values: Mapping[str, Any], source: str) -> dict[str, str]:
    out = {}
    for name, digest in values.items():
        if name not in IMAGE_TARGETS:
            raise DeployError(f"{source}: unknown image {name!r} (one of {', '.join(IMAGE_TARGETS)})")
        if not isinstance(digest, str) or not DIGEST_RE.match(digest):
            raise DeployError(f"{source}: {name} digest {digest!r} is not sha256:<64 hex>")
        out[name] = digest
    if "controlplane" not in out:
        raise DeployError(f"{source}: no controlplane digest (run `gameday infra image` first, "
                          "or give --image-digest controlplane=sha256:...)")
    return out


# --- source archive --------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    commit: str
    dirty: bool
    data: bytes

    def key(self, stack: str, now: datetime | None = None) -> str:
        stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
        return f"{SOURCE_PREFIX}{stack}/{self.commit}{'-dirty' if self.dirty else ''}-{stamp}.zip"


def _git(repo: Path, *args: str) -> bytes:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], check=True,
                              capture_output=True).stdout
    except FileNotFoundError as exc:
        raise DeployError("git is not installed") from exc
    except subprocess.CalledProcessError as exc:
        raise DeployError(f"git {' '.join(args)} failed in {repo}: "
                          f"{exc.stderr.decode(errors='replace').strip()}") from exc


def check_clean(repo: Path, allow_dirty: bool) -> tuple[str, bool]:
    """(HEAD commit, whether tracked files have uncommitted changes). Changes refuse unless
    ``allow_dirty``; untracked files do not count (they are never built)."""
    changed = _git(repo, "status", "--porcelain", "--untracked-files=no").decode().splitlines()
    if changed and not allow_dirty:
        shown = ", ".join(line[3:] for line in changed[:5]) + (" ..." if len(changed) > 5 else "")
        raise DeployError(f"the working tree of {repo} has uncommitted changes ({shown}): "
                          "commit them (the archive is HEAD), or pass --allow-dirty to build "
                          "them as they are")
    return _git(repo, "rev-parse", "--short=12", "HEAD").decode().strip(), bool(changed)


def package_source(repo: Path, allow_dirty: bool = False) -> Source:
    """``git archive --format=zip`` of HEAD (``check_clean`` first). With ``allow_dirty`` the
    uncommitted changes are archived too, via ``git stash create``, which leaves the working
    tree and the stash list alone. Untracked files are never archived."""
    commit, changed = check_clean(repo, allow_dirty)
    tree = (_git(repo, "stash", "create").decode().strip() if changed else "") or "HEAD"
    return Source(commit, bool(changed), _git(repo, "archive", "--format=zip", tree))


# --- CodeBuild -------------------------------------------------------------------------------

def upload(s3: Any, bucket: str, key: str, data: bytes) -> str:
    """Put the archive; returns the CodeBuild S3 source location ``bucket/key``."""
    s3.put_object(Bucket=bucket, Key=key, Body=data, ContentType="application/zip")
    return f"{bucket}/{key}"


def start_build(codebuild: Any, project: str, location: str,
                variables: Mapping[str, str]) -> str:
    build = codebuild.start_build(
        projectName=project, sourceTypeOverride="S3", sourceLocationOverride=location,
        environmentVariablesOverride=[{"name": k, "value": v, "type": "PLAINTEXT"}
                                      for k, v in sorted(variables.items())],
    )["build"]
    return build["id"]


def wait_build(codebuild: Any, build_id: str, echo: Callable[[str], None],
               poll_seconds: float = 15.0, sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Poll until the build ends; print each phase change (with elapsed seconds)."""
    started, last = clock(), None
    while True:
        builds = codebuild.batch_get_builds(ids=[build_id]).get("builds") or []
        if not builds:
            raise DeployError(f"build {build_id} not found (batch_get_builds returned nothing)")
        build = builds[0]
        phase, status = build.get("currentPhase"), build.get("buildStatus")
        if (phase, status) != last:
            echo(f"  {clock() - started:6.0f}s  {phase or '?'}  ({status})")
            last = (phase, status)
        if status in TERMINAL:
            return build
        sleep(poll_seconds)


def failure_message(build: Mapping[str, Any]) -> str:
    """What failed and where its log is."""
    status = build.get("buildStatus")
    failed = [f"{p.get('phaseType')}: " + "; ".join(
                  c.get("message", "") for c in p.get("contexts") or [] if c.get("message"))
              for p in build.get("phases") or []
              if p.get("phaseStatus") not in (None, "SUCCEEDED")]
    logs = build.get("logs") or {}
    where = (f"log group {logs.get('groupName')}, stream {logs.get('streamName')}"
             if logs.get("groupName") else "no CloudWatch log location reported")
    link = f"\n  {logs['deepLink']}" if logs.get("deepLink") else ""
    return (f"build {build.get('id')} {status}" + (f" in {'; '.join(failed)}" if failed else "")
            + f"\n  {where}{link}")


def exported_digests(build: Mapping[str, Any]) -> dict[str, str]:
    """Digests from the image build's ``exportedEnvironmentVariables``; an empty value means
    the image was not built (no repository for it in this stack)."""
    exported = {v.get("name"): v.get("value") or ""
                for v in build.get("exportedEnvironmentVariables") or []}
    values = {name: exported[var] for name, var in DIGEST_VARIABLES.items() if exported.get(var)}
    if "controlplane" not in values:
        raise DeployError(f"build {build.get('id')} succeeded but exported no "
                          f"{DIGEST_VARIABLES['controlplane']} (exported: "
                          f"{sorted(k for k in exported if k)}); see provisioning/buildspecs/image.yml")
    return parse_digests(values, f"build {build.get('id')} exported variables")


def run_build(session: Any, runner: Runner, project: str, stack: str, source: Source,
              variables: Mapping[str, str], echo: Callable[[str], None],
              poll_seconds: float) -> dict[str, Any]:
    """Upload, start, wait; raise DeployError unless the build SUCCEEDED."""
    s3, codebuild = session.client("s3"), session.client("codebuild")
    key = source.key(stack)
    echo(f"uploading {len(source.data) / 1e6:.1f} MB source ({source.commit}"
         f"{', with uncommitted changes' if source.dirty else ''}) to s3://{runner.source_bucket}/{key}")
    location = upload(s3, runner.source_bucket, key, source.data)
    build_id = start_build(codebuild, project, location,
                           {"SOURCE_REVISION": source.commit, **variables})
    echo(f"started {build_id} (logs: {runner.log_group})")
    try:
        build = wait_build(codebuild, build_id, echo, poll_seconds)
    except KeyboardInterrupt:
        raise DeployError(f"interrupted: build {build_id} goes on in CodeBuild; stop it with "
                          f"`aws codebuild stop-build --id {build_id}`") from None
    if build.get("buildStatus") != "SUCCEEDED":
        raise DeployError(failure_message(build))
    return build


# --- local Docker ----------------------------------------------------------------------------

def repo_digest(inspect_output: str, repository: str) -> str:
    """The digest from ``docker inspect --format '{{index .RepoDigests 0}}'`` (``repo@sha256:...``),
    checked to belong to the repository that was pushed."""
    text = inspect_output.strip()
    repo, _, digest = text.partition("@")
    if repo != repository or not DIGEST_RE.match(digest):
        raise DeployError(f"docker inspect gave {text!r}, expected {repository}@sha256:<64 hex> "
                          "(was the push successful?)")
    return digest


def _docker(args: Sequence[str], docker: str, stdin: str | None = None,
            capture: bool = True) -> str:
    """Run the docker client; ``capture=False`` lets build/push progress through to the
    terminal (stderr), so long builds show what they are doing."""
    import sys

    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (e.g. captured): capture
        capture = True
    out = subprocess.PIPE if capture else sys.stderr
    try:
        done = subprocess.run([docker, *args], input=stdin, text=True, check=False,
                              stdout=out, stderr=out)
    except FileNotFoundError as exc:
        raise DeployError(f"{docker} not found: --local needs a Docker client and engine") from exc
    if done.returncode != 0:
        detail = (done.stderr or done.stdout or "").strip()[-2000:] if capture else "output above"
        raise DeployError(f"docker {args[0]} failed ({done.returncode}): {detail}")
    return done.stdout or ""


def ecr_password(session: Any) -> str:
    token = session.client("ecr").get_authorization_token()["authorizationData"][0]
    return base64.b64decode(token["authorizationToken"]).decode().partition(":")[2]


def stack_targets(work_dir: Path, stack: str) -> tuple[str, ...]:
    """The targets the platform stack ``stack`` builds (``built_targets``), from its
    ``Pulumi.<stack>.yaml`` in the checkout: what the image project's repository variables say
    for a CodeBuild build."""
    path = work_dir / f"Pulumi.{stack}.yaml"
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise DeployError(f"{path}: cannot read the platform stack's config ({exc}): it says "
                          "which images the stack runs") from exc
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        raise DeployError(f"{path}: has no 'config' mapping")
    prefix = f"{PROJECT}:"
    raw = {k[len(prefix):]: v for k, v in config.items()
           if isinstance(k, str) and k.startswith(prefix)}
    raw.pop("layer", None)  # a platform stack's, as load_stack_config reads it
    try:
        return built_targets(parse_stack_config(raw, path.name))
    except ConfigError as exc:
        raise DeployError(str(exc)) from exc


def local_build(repositories: Mapping[str, str], tag: str, context: Path, password: str,
                echo: Callable[[str], None], docker: str = "docker",
                targets: Sequence[str] = IMAGE_TARGETS) -> dict[str, str]:
    """Build, push and resolve each of ``targets`` the stack has a repository for with the
    local Docker engine. The registry password goes to ``docker login`` on stdin, never as an
    argument."""
    targets = [t for t in IMAGE_TARGETS if t in targets and t in repositories]
    if "controlplane" not in targets:
        raise DeployError("the platform stack's outputs have no 'controlplane' repository")
    for host in sorted({repositories[t].split("/")[0] for t in targets}):
        _docker(["login", "--username", "AWS", "--password-stdin", host], docker, stdin=password)
    digests = {}
    for target in targets:
        ref = f"{repositories[target]}:{tag}"
        echo(f"docker build --target {target} -t {ref}")
        _docker(["build", "--target", target, "-t", ref, str(context)], docker, capture=False)
        echo(f"docker push {ref}")
        _docker(["push", ref], docker, capture=False)
        digests[target] = repo_digest(
            _docker(["inspect", "--format", "{{index .RepoDigests 0}}", ref], docker),
            repositories[target])
    return digests
