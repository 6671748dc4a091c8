# Two set-up commands for a fresh machine: `make demo` and `make test`.
# Both create .venv and install what they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv test lint typing layers check demo bench bench-smoke soak clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt "torch==2.13.0"
	$(PIP) install -q -c constraints.txt -e ".[dev,torch,ray,demo,bench]"
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

typing: $(STAMP)
	$(VENV)/bin/mypy

layers: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache

check: lint typing layers test

demo: $(STAMP)
	$(PY) -m twinkle.cli demo $(DEMO_ARGS)

bench: $(STAMP)
	$(PY) -m bench

bench-smoke: $(STAMP)
	$(PY) -m bench --smoke

soak: $(STAMP)
	$(PY) -m pytest -q -m soak tests/reliability

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build src/*.egg-info
