"""Airflow DAG file: one DAG cdc_<name> per valid row of the CDC config table ($CDC_CONFIG)."""

from cdc_airflow.dag_files.tables import *  # noqa: F403
