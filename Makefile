PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
JARS_STAMP := jars/.fetched
DEBEZIUM_STAMP := .tools/debezium-server/.fetched
MOTO_STAMP := .tools/moto/.installed
DEPLOY_STAMP := .tools/deploy/.installed
TEST_CATALOG_STAMP := .tools/spark-test-catalog/.fetched
KAFKA_STAMP := .tools/kafka/.fetched

.PHONY: install demo test test-fast test-lowest-airflow test-chart-schema lint typecheck clean system airflow bench bench-smoke bench-cycle

install: $(STAMP) $(JARS_STAMP)

# Debian packages: Java 17 for Spark; docker-compose to validate docker-compose.yaml (no engine);
# Chromium and its driver for the browser test; PostgreSQL 15 and wal2json for the real-source
# test, Redis for the deployment's topology test (started by the tests on 127.0.0.1, never as a
# service).
system:
	@missing=""; \
	command -v java >/dev/null 2>&1 || missing="$$missing openjdk-17-jre-headless"; \
	command -v docker-compose >/dev/null 2>&1 || missing="$$missing docker-compose"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	command -v mvn >/dev/null 2>&1 || missing="$$missing maven"; \
	test -x /usr/lib/postgresql/15/bin/postgres || missing="$$missing postgresql-15"; \
	test -e /usr/lib/postgresql/15/lib/wal2json.so || missing="$$missing postgresql-15-wal2json"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# Every package the image also has is installed at the image's pinned version (docker/constraints.txt,
# python-dateutil left to pip: see its header), so a fresh machine gets the versions the tests ran on,
# not whatever the index published since.
$(STAMP): pyproject.toml docker/constraints.txt | system
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	grep -v '^python-dateutil==' docker/constraints.txt > $(VENV)/constraints.txt
	$(BIN)/python -m pip install --quiet --constraint $(VENV)/constraints.txt -e '.[dev]'
	$(BIN)/python -m pip check
	@touch $(STAMP)

# The Spark jars (Delta Lake's reader and catalog; S3A and the AWS SDK modules it needs), pinned
# in docker/jars-pom.xml, copied into jars/ once; Spark never resolves packages at run time.
$(JARS_STAMP): docker/jars-pom.xml | system
	rm -rf jars && mkdir -p jars
	mvn -q -B -f docker/jars-pom.xml dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/jars
	@touch $(JARS_STAMP)

# Debezium Server for the real-source tests (docker/debezium-pom.xml), unpacked once.
$(DEBEZIUM_STAMP): docker/debezium-pom.xml | system
	rm -rf .tools/debezium-server && mkdir -p .tools
	mvn -q -B -f docker/debezium-pom.xml dependency:unpack-dependencies -DincludeTypes=tar.gz \
	  -DoutputDirectory=$(CURDIR)/.tools
	@touch $(DEBEZIUM_STAMP)

# A Kafka broker's jars for the Kafka tests (docker/kafka-pom.xml; tests/kafka.py runs a KRaft
# single node from them), copied once.
$(KAFKA_STAMP): docker/kafka-pom.xml | system
	rm -rf .tools/kafka && mkdir -p .tools/kafka
	mvn -q -B -f docker/kafka-pom.xml dependency:copy-dependencies \
	  -DoutputDirectory=$(CURDIR)/.tools/kafka
	@touch $(KAFKA_STAMP)

# Spark's in-memory row-level test table for the AUTO CDC benchmark (docker/spark-test-catalog-pom.xml).
$(TEST_CATALOG_STAMP): docker/spark-test-catalog-pom.xml | system
	rm -rf .tools/spark-test-catalog && mkdir -p .tools/spark-test-catalog
	mvn -q -B -f docker/spark-test-catalog-pom.xml dependency:copy-dependencies \
	  -DoutputDirectory=$(CURDIR)/.tools/spark-test-catalog
	@touch $(TEST_CATALOG_STAMP)

# moto's standalone S3 server for the object-storage tests, in a venv of its own.
$(MOTO_STAMP): docker/moto-requirements.txt
	rm -rf .tools/moto && $(PY) -m venv .tools/moto
	.tools/moto/bin/python -m pip install --quiet --no-deps -r docker/moto-requirements.txt
	@touch $(MOTO_STAMP)

# The image's Python environment (Dockerfile: the project and its `deploy` extra under
# docker/constraints.txt) for the deployment's topology test (tests/deploy), in a venv of its own:
# FAB (and botocore) need python-dateutil<3, as in the tested venv.
$(DEPLOY_STAMP): pyproject.toml docker/constraints.txt | system
	rm -rf .tools/deploy && $(PY) -m venv .tools/deploy
	.tools/deploy/bin/python -m pip install --quiet --upgrade pip
	.tools/deploy/bin/python -m pip install --quiet --constraint docker/constraints.txt -e '.[deploy]'
	.tools/deploy/bin/python -m pip check
	@touch $(DEPLOY_STAMP)

demo: install
	$(BIN)/cdc demo

lint: install
	$(BIN)/ruff check cdc_pipeline cdc_airflow spark_jobs cdc_tools dags plugins tests
	$(BIN)/ruff format --check cdc_pipeline cdc_airflow spark_jobs cdc_tools dags plugins tests
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy

test: install lint typecheck $(DEBEZIUM_STAMP) $(MOTO_STAMP) $(DEPLOY_STAMP) $(TEST_CATALOG_STAMP) \
  $(KAFKA_STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder \
	  --junitxml=test-artifacts/junit.xml tests
	$(MAKE) bench-smoke

# The inner loop (about 2 minutes): lint, types, the unit tests, the repo checks and the DAG parsing tests; no
# Spark session, no server. `make test` runs everything.
test-fast: install lint typecheck
	$(BIN)/python -m pytest -q tests/unit tests/repo tests/dags/test_dags.py tests/dags/test_config_property.py \
	  tests/dags/test_operations_dags.py

# The lowest Airflow the package declares (3.2.0 and the lowest providers, from the package index,
# 3-6 minutes): `make test` deselects it for CI's time budget.
test-lowest-airflow: install
	CDC_TEST_LOWEST_AIRFLOW=1 $(BIN)/python -m pytest tests/wheel_install/test_lowest_airflow.py

# deploy/kubernetes/airflow-values.yaml against the Airflow Helm chart's values.schema.json (put it
# in .tools/airflow-chart/ first: docs/kubernetes.md); `make test` deselects it.
test-chart-schema: install
	CDC_TEST_CHART_SCHEMA=1 $(BIN)/python -m pytest tests/repo/test_kubernetes_manifests.py

# overwrite-final vs a full rebuild, delta-rs MERGE (streamed and not) and delta-spark MERGE INTO
# (with and without deletion vectors) (over 10 minutes on 2 cores); options: .venv/bin/cdc bench
# --help (--methods, --kafka-messages N). Results: bench-results/latest.json and latest.png.
bench: install
	$(BIN)/cdc bench

# The same harness at tiny sizes (about a minute): fails if the methods disagree.
bench-smoke: install
	$(BIN)/cdc bench --smoke

# N tables through one scheduling cycle of a real Airflow, Spark Connect vs spark-submit
# (options: .venv/bin/cdc bench-cycle --help; 65 tables in spark-submit mode take ~50 min here:
# e.g. --tables 10 --mode both, then --tables 65 --mode connect).
# Results: bench-results/cycle/latest.json and latest.png.
bench-cycle: install
	$(BIN)/cdc bench-cycle $(ARGS)

clean:
	rm -rf $(VENV) landing warehouse .pytest_cache .mypy_cache .ruff_cache .tools

airflow: install
	$(BIN)/python -m cdc_airflow.local.launcher
