# Two entry points for a fresh machine: `make demo` and `make test`.
# Everything they need (venv, packages, a Java runtime) is installed here.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN)/python)

.PHONY: setup demo test lint java clean

setup: $(STAMP) java

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,service,spark,bench]'
	touch $(STAMP)

# Spark needs a JVM: use the one found, else install Debian's headless JRE.
java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "no java found: installing openjdk-17-jre-headless"; \
	  apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless; }

demo: setup
	$(BIN)/lowtide demo

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/mypy

test: setup lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info
