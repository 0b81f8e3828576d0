"""The durability stream end to end, from a fresh clone (`make test-tier2`: a `core` game day
with 100 extra submissions a second takes about 12 minutes and most of a 2-core machine): the
audit of a core game day, whose api and db faults hit the stream's submissions like the
background load's, counts at least 29,956 acknowledged submissions with none lost, so its 95 %
lower bound demonstrates 99.99 % (slo/confidence.py); the stream's own records say what it
sent, and its held work is canceled at the end. The gate's exit code is not asserted: on a
shared machine the stream's CPU may cost other objectives (README, "Enough events")."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.gameday.freshclone import FreshClone, fresh_env
from tests.gameday.localrun import only_run

pytestmark = [pytest.mark.slow, pytest.mark.tier2]

DEMONSTRATES_99_99 = 29_956  # ln(0.05) / ln(0.9999), rounded up


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshClone]:
    yield from fresh_env(tmp_path_factory)


@pytest.mark.timeout(2400)
def test_a_core_game_day_with_the_stream_demonstrates_four_nines_of_durability(
        clone: FreshClone) -> None:
    runs = clone.root / "stream-runs"
    r = clone.gameday("run", "--suite", "core", "--durability-stream", "100", "--runs-dir",
                      str(runs), timeout=2200)
    assert r.returncode in (0, 2), r.stdout[-6000:] + r.stderr[-3000:]
    run_dir = only_run(runs)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    [sli] = [s for s in verdict["slis"] if s["name"] == "submission-durability"]
    demo = sli["demonstration"]
    assert demo["failures"] == 0 and sli["good"] == sli["total"], sli["details"]
    assert demo["events"] >= DEMONSTRATES_99_99, demo
    assert demo["lower_bound"] >= 0.9999, demo
    stream = json.loads((run_dir / "run.json").read_text())["durability_stream"]
    assert stream["stopped"] and "error" not in stream and "held_cancel_error" not in stream
    assert stream["held_canceled"] >= stream["acked"] > DEMONSTRATES_99_99 - 1000
    ledger = [json.loads(x) for x in (run_dir / "ledger.jsonl").read_text().splitlines() if x]
    assert sum(e.get("source") == "durability-stream" for e in ledger) == stream["acked"]
    assert (run_dir / "durability-stream-requests.jsonl").stat().st_size
