"""`from cdc_airflow.dag_files.config_errors import *`: invalid config rows as an import error.

The error names each invalid row's table, field and `file:line`; the file holding this line
has no DAG, so the valid tables' DAGs (cdc_airflow.dag_files.tables) keep loading. It imports
the config loader only, not the DAG builder and the operator: the DAG processor parses it in a
process of its own every 30 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cdc_pipeline.config import ConfigLoadResult, load_table_configs


def config_problems_message(result: ConfigLoadResult) -> str | None:
    """The import error text for invalid config rows, or None when every row is valid."""
    if not result.problems:
        return None
    lines = "\n".join(str(p) for p in result.problems)
    return f"invalid rows in the CDC config table (these tables have no DAG):\n{lines}"


def raise_config_problems(config_path: Path | str | None = None) -> None:
    """Raise the invalid rows as this DAG file's import error (the valid DAGs load elsewhere)."""
    message = config_problems_message(load_table_configs(config_path))
    if message:
        raise ValueError(message)


def __getattr__(name: str) -> Any:
    """`__all__` reads the config table ($CDC_CONFIG) now and raises its invalid rows; empty."""
    if name == "__all__":
        raise_config_problems()
        return []
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
