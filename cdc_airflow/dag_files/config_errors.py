"""`from cdc_airflow.dag_files.config_errors import *`: invalid config rows as an import error.

The error names each invalid row's table, field and `file:line`; the file holding this line
has no DAG, so the valid tables' DAGs (cdc_airflow.dag_files.tables) keep loading.
"""

from __future__ import annotations

from typing import Any

from cdc_airflow.dags import raise_config_problems


def __getattr__(name: str) -> Any:
    """`__all__` reads the config table ($CDC_CONFIG) now and raises its invalid rows; empty."""
    if name == "__all__":
        raise_config_problems()
        return []
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
