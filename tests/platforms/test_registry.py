"""The platform registry: a name maps to an adapter, a local-environment module and a load
generator, each platform a plugin declared by entry point (group ``gameday.platforms``); an
unknown or broken platform is refused with a message that says which and why, and nothing else
in the harness names a platform."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import grimp
import pytest

from environments.local.errors import EnvError
from environments.local.platform import HOOKS, local_platform
from platforms import PLATFORMS, PlatformError, get_adapter, registry

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = """
from platforms.registry import Platform


def adapter():
    from platforms.prefect import PrefectAdapter

    return PrefectAdapter.from_env


def load():
    from loadtests.adapter_load import start_for_platform

    return start_for_platform


FAKE = Platform("fake", "a third party's platform", adapter=adapter, local=None, load=load)
NOT_A_PLATFORM = 42
"""


def install_fake_distribution(root: Path, name: str, entry_points: dict[str, str],
                              monkeypatch: pytest.MonkeyPatch, module: str = "") -> None:
    """A distribution as pip leaves it (a .dist-info directory with METADATA and
    entry_points.txt, beside its modules) on sys.path for this test."""
    root.mkdir(parents=True, exist_ok=True)
    info = root / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[gameday.platforms]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    if module:
        (root / f"{module}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(root))


def test_every_registered_platform_resolves_all_its_parts() -> None:
    assert set(PLATFORMS) >= {"controlplane", "prefect"}
    for name, p in registry.REGISTRY.items():
        assert callable(p.resolve("adapter")) and callable(p.resolve("load")), name
        module = local_platform(name)
        assert all(callable(getattr(module, h)) for h in HOOKS), name


def test_an_unknown_platform_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(PlatformError, match=r"unknown platform 'airflow'; known: controlplane"):
        get_adapter("airflow", {}, {})
    with pytest.raises(EnvError, match="unknown platform 'airflow'"):
        local_platform("airflow")


def _typo_adapter() -> object:
    from platforms.prefect import PrefectAdaptr  # type: ignore[attr-defined]

    return PrefectAdaptr.from_env


def _missing_load() -> object:
    from loadtests.nope import start  # type: ignore[import-not-found]

    return start


def _not_hooks() -> ModuleType:
    from environments.local import topology

    return topology


def test_a_broken_part_is_refused_naming_the_part(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = registry.Platform("broken", "a typo in its adapter's import",
                               adapter=_typo_adapter, local=_not_hooks, load=_missing_load)
    monkeypatch.setitem(registry.REGISTRY, "broken", broken)
    with pytest.raises(PlatformError, match=r"platform 'broken': its adapter "
                                            r"\(tests.platforms.test_registry:_typo_adapter\) "
                                            r"cannot be loaded \(ImportError: .*PrefectAdaptr"):
        get_adapter("broken", {}, {})
    with pytest.raises(PlatformError, match=r"its load \(.*_missing_load\) cannot be loaded "
                                            r"\(ModuleNotFoundError: No module named 'loadtests.nope'"):
        broken.resolve("load")
    with pytest.raises(EnvError, match="does not implement the local platform hooks"):
        local_platform("broken")  # environments.local.topology is not a LocalPlatform module


def test_an_installed_distribution_adds_a_platform_by_entry_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_distribution(tmp_path / "site", "gameday-fake", {"fake": "fake_plugin:FAKE"},
                              monkeypatch, module="fake_plugin")
    monkeypatch.setattr(registry, "REGISTRY", registry.Registry())
    assert list(registry.REGISTRY) == ["controlplane", "fake", "prefect"]
    assert registry.get("fake").description == "a third party's platform"
    assert callable(registry.get("fake").resolve("adapter"))
    assert registry.get("controlplane").cloud  # the house's own still found beside it


@pytest.mark.parametrize(("value", "why"), [
    ("fake_plugin_gone:FAKE",
     r"cannot be loaded \(ModuleNotFoundError: No module named 'fake_plugin_gone'\)"),
    ("fake_plugin:FAKEE", r"cannot be loaded \(AttributeError: .*FAKEE"),
    ("fake_plugin:NOT_A_PLATFORM", r"is of type int, not a platforms.registry.Platform"),
])
def test_a_broken_entry_point_is_refused_naming_it_and_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, why: str) -> None:
    install_fake_distribution(tmp_path / "site", "gameday-broken", {"airflow": value},
                              monkeypatch, module="fake_plugin")
    monkeypatch.setattr(registry, "REGISTRY", registry.Registry())
    assert "airflow" in registry.REGISTRY  # declared: listed, refused only when asked for
    named = rf"platform 'airflow': its entry point '{value}' \(distribution gameday-broken 1.0\) "
    with pytest.raises(PlatformError, match=named + why):
        get_adapter("airflow", {}, {})
    assert registry.get("prefect").name == "prefect"  # one broken plugin breaks no other


def test_a_misnamed_or_twice_declared_platform_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_distribution(tmp_path / "a", "gameday-a", {"airflow": "fake_plugin:FAKE"},
                              monkeypatch, module="fake_plugin")
    install_fake_distribution(tmp_path / "b", "gameday-b", {"prefect": "fake_plugin:FAKE"},
                              monkeypatch)
    monkeypatch.setattr(registry, "REGISTRY", registry.Registry())
    with pytest.raises(PlatformError, match=r"platform 'airflow': its entry point "
                                            r"'fake_plugin:FAKE' .* declares the platform "
                                            r"'fake': the names must match"):
        registry.get("airflow")
    with pytest.raises(PlatformError, match=r"platform 'prefect' is declared more than once: ") as e:
        registry.get("prefect")
    assert "'fake_plugin:FAKE' (distribution gameday-b 1.0)" in str(e.value)
    assert "'gameday.builtin_platforms:PREFECT'" in str(e.value)


def test_a_stale_install_of_this_checkout_falls_back_to_its_pyproject(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an editable install made before the group existed: its metadata declares none
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [])
    declared = registry.declared_entry_points()
    assert [(ep.name, ep.value) for ep in declared] == [
        ("controlplane", "gameday.builtin_platforms:CONTROLPLANE"),
        ("prefect", "gameday.builtin_platforms:PREFECT")]
    # re-installed (`pip install -e .`): the house's own metadata declares them, no fallback
    monkeypatch.undo()
    install_fake_distribution(tmp_path / "site", "mlplatform-gameday",
                              {"controlplane": "gameday.builtin_platforms:CONTROLPLANE"},
                              monkeypatch)
    declared = registry.declared_entry_points()
    assert [(ep.name, ep.dist.name if ep.dist else None) for ep in declared] == [
        ("controlplane", "mlplatform-gameday")]


def test_the_floor_checker_sees_every_part_of_every_builtin_platform() -> None:
    """The entry points name objects on the top floor whose parts are ordinary imports:
    import-linter's graph has each one (it never sees an import by string)."""
    graph = grimp.build_graph(*("gameday", "operations", "provisioning", "chaos", "environments", "loadtests", "platforms", "slo",
                                "controlplane"), cache_dir=None)
    for ep in registry.source_tree_entry_points():
        platform = ep.load()
        for field in ("adapter", "local", "load"):
            if getattr(platform, field) is None:
                continue
            part = platform.resolve(field)
            module = part.__name__ if isinstance(part, ModuleType) else part.__module__
            assert graph.direct_import_exists(importer=ep.module, imported=module), (ep.name, field)
    assert graph.find_modules_directly_imported_by("platforms.registry") == {"platforms.base"}


def test_nothing_outside_the_registry_names_a_platform() -> None:
    """No `platform == "prefect"`-style branch anywhere: adding a platform is one module and
    one registry line."""
    pattern = re.compile(r"""(platform|opts\.platform)\s*[!=]=\s*["'](controlplane|prefect)["']""")
    hits = [f"{f}:{n}" for pkg in ("gameday", "operations", "provisioning", "chaos", "environments", "loadtests", "platforms", "slo")
            for f in (ROOT / pkg).rglob("*.py")
            for n, line in enumerate(f.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
