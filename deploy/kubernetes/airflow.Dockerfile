# The Airflow image for the official Helm chart (deploy/kubernetes/airflow-values.yaml): Apache
# Airflow's own image plus the project's wheel in its light install (the Spark Connect client,
# pyspark-client: no JVM, no jars; every step runs as a client of the spark-connect Service),
# the FAB auth manager and the Celery provider at the versions the compose image pins, all under
# docker/constraints.txt, and the two one-line DAG files in the chart's DAGs folder.
# Build from the checkout's root (never built here: docs/kubernetes.md):
#   docker build -f deploy/kubernetes/airflow.Dockerfile -t registry.example.com/cdc-airflow:0.1.0 .
FROM python:3.11-slim-bookworm AS wheel
COPY . /src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist /src

FROM apache/airflow:3.3.2-python3.11
COPY docker/constraints.txt /tmp/constraints.txt
COPY --from=wheel /dist /tmp/dist
# `apache-airflow==3.3.2` keeps pip from moving the image's Airflow; no extra: the light install.
RUN pip install --no-cache-dir --constraint /tmp/constraints.txt \
      "apache-airflow==3.3.2" \
      "$(ls /tmp/dist/*.whl)" \
      "apache-airflow-providers-fab==3.10.2" \
      "apache-airflow-providers-celery==3.26.0" \
 && pip check
# The chart's DAGs folder ({airflowHome}/dags): the checkout's two one-line DAG files.
COPY dags/cdc_tables.py dags/cdc_config_errors.py /opt/airflow/dags/
