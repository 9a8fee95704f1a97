# The project image for every service of docker-compose.yaml: Python 3.11, Java 17 for Spark,
# the package with its pinned stack (Spark, delta-rs, Airflow), and Celery/Postgres clients.
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/cdc
COPY . .
RUN pip install --no-cache-dir -e . \
      "apache-airflow-providers-celery==3.26.0" "psycopg2-binary>=2.9,<3" "redis>=5,<7"
ENV CDC_LANDING=/data/landing \
    CDC_WAREHOUSE=/data/warehouse \
    CDC_CONFIG=/opt/cdc/config/tables.yaml \
    SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark
