"""Airflow DAG file that shows invalid CDC config rows as an import error naming table and field.

It is separate from cdc_tables.py so that the valid tables' DAGs keep loading.
"""

from cdc_airflow.dags import raise_config_problems

raise_config_problems()
