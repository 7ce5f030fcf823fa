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

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
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
