PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint typecheck clean java

install: $(STAMP)

# Spark needs a Java runtime (17); install it from Debian when the machine has none.
java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "no java: installing openjdk-17-jre-headless"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; }

$(STAMP): pyproject.toml | java
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip check
	@touch $(STAMP)

demo: install
	$(BIN)/cdc demo

lint: install
	$(BIN)/ruff check cdc_pipeline spark_jobs dags plugins tests
	$(BIN)/ruff format --check cdc_pipeline spark_jobs dags plugins tests

typecheck: install
	$(BIN)/mypy

test: install lint typecheck
	$(BIN)/python -m pytest tests

clean:
	rm -rf $(VENV) landing warehouse .pytest_cache .mypy_cache .ruff_cache
