# The project image for every service of docker-compose.yaml: Python 3.11, Java 17 for Spark,
# the package with its pinned stack (Spark, delta-rs, Airflow), the FAB auth manager, and the
# Celery/Postgres/Redis clients. Every Python package is pinned by docker/constraints.txt (the
# tested venv's versions; how it is made is at its top), as Airflow asks of any install.
# The Spark jars (Delta Lake, S3A and the AWS SDK modules it needs) come from Maven Central at
# build time, pinned by docker/jars-pom.xml as `make install` fetches them; never at run time.
FROM maven:3.9-eclipse-temurin-17 AS jars
COPY docker/jars-pom.xml /build/jars-pom.xml
RUN mvn -q -B -f /build/jars-pom.xml dependency:copy-dependencies -DoutputDirectory=/build/jars

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
COPY . .
COPY --from=jars /build/jars /opt/cdc/jars
RUN pip install --no-cache-dir --constraint docker/constraints.txt -e ".[deploy]" \
 && pip check
# CDC_LANDING and CDC_WAREHOUSE are the deployment's (docker-compose.yaml: s3://cdc/...).
ENV CDC_CONFIG=/opt/cdc/config/tables.yaml \
    AIRFLOW_HOME=/opt/airflow \
    SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark
USER 50000
