# SAKURA — set-up and everyday commands. `make demo` and `make test` work from a fresh clone:
# both create .venv and install the project (editable, with test extras) when needed.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help venv test fuzz demo store lint catalog-sheet clean

help:
	@echo "make demo           run the demo on the embedded default catalog"
	@echo "make test           run the test suite"
	@echo "make fuzz           the property tests with 10 000 cases each (the suite runs 500)"
	@echo "make store          run a local S3 object store (SeaweedFS) for packs; prints its endpoint"
	@echo "make venv           create .venv and install (re-installs when pyproject.toml changes)"
	@echo "make lint           ruff check (configuration in pyproject.toml; CI runs it before the tests)"
	@echo "make catalog-sheet  redraw docs/catalog.png (every template with its mask)"

# (Re)install only when pyproject.toml is newer than the stamp. torch is pinned in pyproject.toml;
# never install an unpinned torch (it resolves to a multi-GB CUDA build).
venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -e '.[test]'
	@touch $(STAMP)

test: venv
	$(BIN)/python -m pytest -q

fuzz: venv
	HYPOTHESIS_PROFILE=long $(BIN)/python -m pytest -q tests/test_parser_properties.py tests/test_hostile_rates.py

demo: venv
	$(BIN)/sakura demo

store: venv
	$(BIN)/sakura store

lint: venv
	$(BIN)/python -m ruff check sakura app device_bridge tests

catalog-sheet: venv
	$(BIN)/python -m sakura.catalog.contact_sheet docs/catalog.png

clean:
	rm -rf .pytest_cache build dist *.egg-info
