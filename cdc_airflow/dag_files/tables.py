"""`from cdc_airflow.dag_files.tables import *`: one DAG per valid row of the config table."""

from __future__ import annotations

from typing import Any

from cdc_airflow.dags import build_dags

_dags: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """`__all__` builds the DAGs of the config table ($CDC_CONFIG) now; a DAG id, its DAG."""
    if name == "__all__":
        _dags.clear()
        _dags.update(build_dags())
        return list(_dags)
    try:
        return _dags[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
