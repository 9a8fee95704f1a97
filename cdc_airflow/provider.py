"""Provider info for Airflow's `apache_airflow_provider` entry point (no Airflow import)."""

from __future__ import annotations

from importlib import metadata
from typing import Any

PACKAGE = "cdc-lakehouse"
# Everything Airflow is told about the package: `airflow providers get cdc-lakehouse`, the
# `[cdc]` section of `airflow config list`, `airflow providers notifications`. The executor is not
# listed: Airflow would warn on every command that it declares no CLI commands.
CONFIG: dict[str, Any] = {
    "cdc": {
        "description": "The CDC lakehouse package's Airflow settings.",
        "options": {
            "task_processes": {
                "description": (
                    "With AIRFLOW__CORE__EXECUTOR=cdc_airflow.local.executor.PreloadingLocalExecutor: "
                    "the task processes that run at once, at most core.parallelism (unset: "
                    "core.parallelism, as the LocalExecutor). The tasks the scheduler hands over "
                    "beyond them wait in the executor and start the moment a process is free."
                ),
                "version_added": "0.1.0",
                "type": "integer",
                "example": "2",
                "default": None,
            },
        },
    },
}


def package_version() -> str:
    """The installed distribution's version."""
    return metadata.version(PACKAGE)


def get_provider_info() -> dict[str, Any]:
    """What Airflow's providers manager reads (airflow/provider_info.schema.json)."""
    return {
        "package-name": PACKAGE,
        "name": "CDC lakehouse",
        "description": (
            "Change data capture into Delta Lake tables with Spark: one DAG per row of the "
            "config table (cdc_airflow.dag_files), the CDC tables view (an airflow.plugins "
            "entry point) and its alert notifiers."
        ),
        "versions": [package_version()],
        "config": CONFIG,
        "notifications": [
            "cdc_airflow.alerts.CdcNotifier",
            "cdc_airflow.alerts.CdcRunTimeoutNotifier",
        ],
    }
