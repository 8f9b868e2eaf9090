# `make figures` and `make test` each create .venv (pinned dependencies) when it is missing.
# The simulator needs only requirements.txt; the tests also cover the real engine (torch, triton).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SIM := $(VENV)/.sim-installed
REAL := $(VENV)/.real-installed

.PHONY: figures test bench clean

$(SIM): requirements.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(SIM)

$(REAL): $(SIM) requirements-real.txt
	$(PY) -m pip install -q -r requirements-real.txt
	touch $(REAL)

figures: $(SIM)
	MPLBACKEND=Agg $(PY) -m slora_vtc figures

test: $(REAL)
	$(PY) -m pytest -q

bench: $(REAL)
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) results .pytest_cache .hypothesis
