"""Gray-fault actions (chaos/gray.py): every toxic of an experiment is checked by `gameday
validate` before anything runs, naming the field, and a driver without gray faults refuses."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from chaos import gray
from chaos.context import ChaosError
from chaos.validate import validate_experiment

EXPERIMENT = Path(__file__).resolve().parents[2] / "chaos" / "experiments" / "network-gray.yaml"


def _with_toxics(tmp_path: Path, toxics: object) -> Path:
    doc = yaml.safe_load(EXPERIMENT.read_text())
    step = next(a for a in doc["method"] if a["provider"]["func"] == "add_toxics")
    step["provider"]["arguments"]["toxics"] = toxics
    path = tmp_path / "network-gray.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_shipped_experiment_is_valid() -> None:
    assert validate_experiment(EXPERIMENT) == []


@pytest.mark.parametrize(("toxics", "expected"), [
    ([{"name": "x", "type": "latency", "attributes": {"latency": "abc"}}],
     "arguments.toxics[0].attributes.latency: must be a number"),
    ([{"name": "x", "type": "latency", "toxicity": 1.5, "attributes": {"latency": 1}}],
     "arguments.toxics[0].toxicity: must be a number from 0 to 1"),
    ([{"name": "x", "type": "jitterbug", "attributes": {}}], "arguments.toxics[0].type:"),
    ([{"name": "x", "type": "latency", "stream": "sideways", "attributes": {"latency": 1}}],
     "arguments.toxics[0].stream:"),
    ([{"name": "x", "type": "bandwidth", "attributes": {"rate": 0}}],
     "arguments.toxics[0].attributes.rate:"),
    ([{"name": "a", "type": "latency", "attributes": {"latency": 1}},
      {"name": "a", "type": "timeout", "attributes": {"timeout": 0}}],
     "arguments.toxics[1].name: 'a' is used twice"),
    ([], "arguments.toxics: a non-empty list of toxics"),
])
def test_a_bad_toxic_is_refused_naming_its_field(tmp_path: Path, toxics: object,
                                                 expected: str) -> None:
    problems = validate_experiment(_with_toxics(tmp_path, toxics))
    assert len(problems) == 1 and expected in problems[0], problems
    assert problems[0].startswith(f"{tmp_path / 'network-gray.yaml'}: method[2].provider.")


def test_a_driver_without_gray_faults_refuses_with_the_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class CloudLike:
        name = "kubernetes+aws"

    monkeypatch.setattr("chaos.context.Context.driver", CloudLike())
    with pytest.raises(ChaosError, match="cannot inject gray network faults"):
        gray.add_toxics("agents", [{"name": "x", "type": "latency", "attributes": {"latency": 1}}])


@pytest.mark.parametrize("hold", [0, -1, "2", True, 301])
def test_a_bad_hold_is_refused_naming_the_argument(tmp_path: Path, hold: object) -> None:
    doc = yaml.safe_load(EXPERIMENT.read_text())
    step = next(a for a in doc["method"] if a["provider"]["func"] == "add_toxics")
    step["provider"]["arguments"]["hold_seconds"] = hold
    path = tmp_path / "network-gray.yaml"
    path.write_text(yaml.safe_dump(doc))
    problems = validate_experiment(path)
    assert len(problems) == 1 and "arguments.hold_seconds: a number of seconds" in problems[0]


class _Network:
    """The local driver's toxic calls, timed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []

    def add(self, target: str, toxic: dict) -> dict:
        self.calls.append(("add", toxic["name"], time.monotonic()))
        return {"target": target, "toxic": toxic}

    def remove(self, target: str, name: str) -> dict:
        self.calls.append(("remove", name, time.monotonic()))
        return {"target": target, "name": name}


def test_a_held_toxic_is_removed_by_the_same_action_after_exactly_its_hold(
        monkeypatch: pytest.MonkeyPatch) -> None:
    net = _Network()
    monkeypatch.setattr(gray, "_network", lambda configuration: net)
    toxics = [{"name": "a", "type": "timeout", "attributes": {"timeout": 0}},
              {"name": "b", "type": "latency", "attributes": {"latency": 1}}]
    out = gray.add_toxics("agents", toxics, hold_seconds=0.3)
    assert [(c[0], c[1]) for c in net.calls] == [("add", "a"), ("add", "b"), ("remove", "a"),
                                                ("remove", "b")]
    assert 0.3 <= net.calls[2][2] - net.calls[1][2] < 0.5
    assert out["held_seconds"] == 0.3 and len(out["removed"]) == 2
    # without a hold the toxics stay for the next action to remove
    net.calls.clear()
    assert "removed" not in gray.add_toxics("agents", toxics[:1])
    assert [c[0] for c in net.calls] == ["add"]


def test_a_held_toxic_is_removed_even_when_the_hold_is_cut_short(
        monkeypatch: pytest.MonkeyPatch) -> None:
    net = _Network()
    monkeypatch.setattr(gray, "_network", lambda configuration: net)

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt  # the operator's Ctrl-C during the blackout

    monkeypatch.setattr(gray.time, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gray.add_toxics("agents", [{"name": "a", "type": "timeout",
                                    "attributes": {"timeout": 0}}], hold_seconds=2)
    assert [c[0] for c in net.calls] == ["add", "remove"]
