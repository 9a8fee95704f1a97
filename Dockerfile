# The project image: Python 3.11, Java 17 for Spark, the package with its pinned stack.
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/cdc
COPY . .
RUN pip install --no-cache-dir -e .
ENV CDC_LANDING=/data/landing \
    CDC_WAREHOUSE=/data/warehouse \
    CDC_CONFIG=/opt/cdc/config/tables.yaml
