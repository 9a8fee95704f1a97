"""Airflow DAG file that shows invalid CDC config rows as an import error naming table and field.

It is separate from cdc_tables.py so that the valid tables' DAGs keep loading.
"""

from cdc_airflow.dag_files.config_errors import *  # noqa: F403
