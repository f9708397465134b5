# Two entry points, each doing all set-up on a fresh machine:
#   make run    install graphrt (and matplotlib, for --plot) into .venv and run `graphrt run` on the default preset
#   make test   install graphrt with its test extras (and Nsight Systems where apt is there), run the tests
#   (make test-fast: the inner loop, the tests not marked slow: no ranks, recordings or fresh interpreters)
# and, for a GPU machine: make gpu-bundle (here), make gpu-check (there), make gpu-rehearsal (here)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install -q -c constraints.txt
# make test: a pytest worker per core (pytest-xdist), each taking the next test as it finishes
# one; PARALLEL= runs them in one process. (The inner loop is quicker in one: a worker's start
# costs more than its share of a minute's tests.)
PARALLEL ?= -n auto --dist worksteal

.PHONY: run test test-fast gpu-check gpu-bundle gpu-rehearsal mutate clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# with the plot extra: README's own examples draw with --plot
$(VENV)/.core: $(BIN)/python setup.cfg constraints.txt
	$(PIP) -e '.[plot]'
	touch $@

$(VENV)/.test: $(VENV)/.core
	$(PIP) -e '.[test]'
	touch $@

run: $(VENV)/.core
	$(BIN)/graphrt run $(ARGS)

test: $(VENV)/.test
	scripts/install-nsys.sh .tools/nsys || echo "Nsight Systems not installed: the nsys tests will be skipped"
	PATH="$(CURDIR)/.tools/nsys/bin:$(PATH)" $(BIN)/python -m pytest -q $(PARALLEL) $(PYTEST_ARGS)

test-fast: $(VENV)/.test
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

gpu-check:
	scripts/gpu_check.sh

# the wheels the device machine lacks (it has no network), into .whl/
gpu-bundle: $(BIN)/python
	PYTHON=$(BIN)/python scripts/gpu_bundle.sh

# every step of the device check on this CPU, in a virtualenv of the device image's packages
gpu-rehearsal: gpu-bundle
	RESULTS=results/gpu-rehearsal PYTHON=$(PYTHON) scripts/gpu_check.sh --rehearse

clean:
	rm -rf $(VENV) .tools .rehearse .whl mutants

# Mutation testing of the core (tests/MUTATION.md); MODULE=graphrt/measure/timing.py for one module.
# Not part of `make test` or CI: the whole core takes a long time on a small machine.
$(VENV)/.dev: $(VENV)/.test
	$(PIP) -e '.[test,dev]'
	touch $@

mutate: $(VENV)/.dev
	PATH="$(CURDIR)/.tools/nsys/bin:$(PATH)" $(BIN)/python scripts/mutate.py $(MODULE)
