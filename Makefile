# One entry point for developers and CI. Everything lives in a local virtualenv (.venv).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: install dev-install build demo test test-rust test-python lint fmt proto bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

## install: the package with its runtime dependencies (release build of the Rust core)
install: $(BIN)/python
	$(BIN)/pip install --quiet .

## dev-install: editable package plus everything tests, lint and benchmarks need
dev-install: $(BIN)/python
	bash scripts/install-system-deps.sh
	$(BIN)/pip install --quiet -e '.[dev]'

## demo: the main job on the embedded store
demo: install
	$(BIN)/python -m millstream run examples.keyed_sum:processor

## test: install, lint, then every Rust and Python test
test: dev-install lint test-rust test-python

test-rust:
	cargo test --workspace --exclude millstream-py --all-targets

test-python:
	$(BIN)/python -m pytest

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python scripts/gen_proto.py --check
	$(BIN)/python scripts/check_sizes.py

fmt:
	cargo fmt --all
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

proto:
	$(BIN)/python scripts/gen_proto.py

bench:
	cargo bench -p millstream-core
	$(BIN)/python -m pytest bench --benchmark-only --benchmark-enable

clean:
	rm -rf $(VENV) target
