# Two entry points: `make demo` (the main job on the embedded demo, TensorRT-LLM's current line; the 1.1 engine flow:
# `make demo DEMO_ARGS="--line 1.1"`) and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test clean

$(STAMP): requirements.txt requirements-data.txt pyproject.toml scripts/setup_env.sh scripts/setup_env_speculators.sh \
          scripts/setup_prometheus.sh scripts/setup_dynamo.sh
	PY=$(PY) bash scripts/setup_env.sh $(VENV)
	touch $(STAMP)

setup: $(STAMP)

DEMO_ARGS ?=

demo: $(STAMP)
	$(VPY) scripts/demo.py $(DEMO_ARGS)

# pytest-xdist workers: one per core of a CI runner; each test file stays on one worker (its module fixtures are
# built once). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

clean:
	rm -rf $(VENV) .venv-speculators .venv-dynamo build
