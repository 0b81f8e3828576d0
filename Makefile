# The README's two commands are `make run` and `make test`; both set up a fresh machine first.
.PHONY: setup run test test-fast bench-controlplane lint clean

VENV := .venv/bin

setup:
	@bash scripts/setup.sh

## The main job: a local game day against the local environment (ends with a report).
run: setup
	$(VENV)/gameday env up

## All tests (real PostgreSQL, HAProxy, Prometheus, registry, moto, Chaos Toolkit, Locust).
test: setup
	$(VENV)/pytest -q

test-fast: setup
	$(VENV)/pytest -q -m "not slow"

## Control-plane throughput/latency/RSS figures on this machine.
bench-controlplane: setup
	$(VENV)/gameday bench controlplane

lint: setup
	$(VENV)/ruff check .

clean:
	rm -rf .gameday .pytest_cache
