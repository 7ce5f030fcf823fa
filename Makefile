# Two entry points for a fresh machine with only Python 3.11:
#   make demo   - create .venv, install mftk, run the end-to-end quick-start on built-in data
#   make test   - create .venv, install mftk with test extras, run the whole test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test venv clean bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(BIN)/mftk quickstart --workdir quickstart

test: venv
	$(BIN)/python -m pytest -q

bench: venv
	bash bench/run_all.sh

clean:
	rm -rf $(VENV) quickstart output
