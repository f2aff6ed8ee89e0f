# The two quickstart commands (`make run`, `make test`) set up everything they need.
# EXTRAS lists the optional backends installed into .venv; families that have landed add theirs.
PY ?= python3
VENV ?= .venv
EXTRAS ?= test,ray,minihack
APT_PACKAGES ?=

.PHONY: setup run test lint bench

$(VENV)/.installed: pyproject.toml constraints.txt
	@if [ -n "$(APT_PACKAGES)" ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && apt-get install -y -qq $(APT_PACKAGES); fi
	$(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q -U pip
	$(VENV)/bin/python -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/python -m eval.run --agent oracle --tasks crl/Sokoban-6x6-2-v0 --episodes 20

test: setup
	$(VENV)/bin/python -m pytest -n 2

lint: setup
	$(VENV)/bin/ruff check .

bench: setup
	$(VENV)/bin/python benchmarks/sokoban.py
