# Two entry points for a fresh machine with only Python 3.11:
#   make demo   - create .venv, install mftk, run the end-to-end quick-start on built-in data
#   make test   - create .venv, install mftk with the test extras, run the whole test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test venv clean bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The demo needs mftk alone; the tests also need torch (CPU) and transformers for parity checks.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

# mindformers 2.1.0 is a test oracle only (its config classes load what mftk writes); the wheel pins
# mindspore~=2.11, which the registry does not have, so it goes in without its dependencies and is never imported whole.
$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/python -m pip install -q --no-deps mindformers==2.1.0
	touch $@ $(VENV)/.installed

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/mftk quickstart --workdir quickstart

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q

bench: $(VENV)/.installed-test
	bash bench/run_all.sh

clean:
	rm -rf $(VENV) quickstart output
