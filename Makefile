# `make demo` and `make test` set up .venv themselves on a machine with only Python on it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test lint demo bench soak clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check pipeline server tests bench examples
	$(BIN)/ruff format --check pipeline server tests bench examples
	$(BIN)/mypy pipeline server

# four workers on any machine: the suite mostly waits on servers and subprocesses (and its
# timing-sensitive tests are written for a loaded machine); `pytest -n 0` runs it serially
test: lint
	$(BIN)/python -m pytest -q -n 4

demo: $(STAMP)
	$(BIN)/python examples/demo.py $(if $(DATA),--data $(DATA))

bench: $(STAMP)
	$(BIN)/python bench/writer.py
	$(BIN)/python bench/reader.py
	$(BIN)/python bench/serve.py
	$(BIN)/python bench/storage.py
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[bench]'
	$(BIN)/python bench/learn.py

soak: $(STAMP)
	$(BIN)/python bench/soak.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
