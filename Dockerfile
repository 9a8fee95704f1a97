# The project image for every service of docker-compose.yaml: Python 3.11, Java 17 for Spark,
# the package with its pinned stack (Spark, delta-rs, Airflow), the FAB auth manager, and the
# Celery/Postgres/Redis clients. Every Python package is pinned by docker/constraints.txt (the
# tested venv's versions; how it is made is at its top), as Airflow asks of any install.
# The Spark jars (Delta Lake, S3A and the AWS SDK modules it needs) come from Maven Central at
# build time, pinned by docker/jars-pom.xml as `make install` fetches them; never at run time.
FROM maven:3.9-eclipse-temurin-17 AS jars
COPY docker/jars-pom.xml /build/jars-pom.xml
RUN mvn -q -B -f /build/jars-pom.xml dependency:copy-dependencies -DoutputDirectory=/build/jars

# The package as users install it: a wheel (tests/install/test_wheel.py checks it holds every
# module and works installed), not the source tree.
FROM python:3.11-slim-bookworm AS wheel
COPY . /src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist /src

FROM python:3.11-slim-bookworm
# curl: the compose healthchecks; procps: Spark's scripts use ps.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps curl \
 && rm -rf /var/lib/apt/lists/*
# The default user of the containers (compose runs them as AIRFLOW_UID:0, 50000 by default).
# Any AIRFLOW_UID (group 0, as compose runs it) can write AIRFLOW_HOME (airflow.cfg, task logs).
RUN useradd --uid 50000 --gid 0 --home-dir /opt/airflow --create-home cdc \
 && chmod -R g+rwX /opt/airflow
WORKDIR /opt/cdc
COPY docker/constraints.txt /opt/cdc/docker/constraints.txt
# Only what the deployment reads beside the package: the config table (compose mounts the
# host's), the one-line DAG files and the plugins folder. No source tree: `python -m` from this
# folder imports the installed package.
COPY config /opt/cdc/config
COPY dags /opt/cdc/dags
COPY plugins /opt/cdc/plugins
COPY --from=jars /build/jars /opt/cdc/jars
COPY --from=wheel /dist /tmp/dist
# `[deploy]` includes `[spark]`, the full pyspark: the image runs the Connect server and
# spark-submit (the package without extras has only the Spark Connect client).
RUN pip install --no-cache-dir --constraint docker/constraints.txt "$(ls /tmp/dist/*.whl)[deploy]" \
 && pip check \
 && rm -rf /tmp/dist
# CDC_LANDING and CDC_WAREHOUSE are the deployment's (docker-compose.yaml: s3://cdc/...).
ENV CDC_CONFIG=/opt/cdc/config/tables.yaml \
    CDC_SPARK_JARS=/opt/cdc/jars \
    AIRFLOW_HOME=/opt/airflow \
    SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark
USER 50000
