"""Airflow DAG file: one DAG cdc_<name> per valid row of the CDC config table ($CDC_CONFIG)."""

from cdc_airflow.dags import build_dags

globals().update(build_dags())
