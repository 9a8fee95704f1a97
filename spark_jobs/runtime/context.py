"""The step context: a configured table, where its data lives, and the Spark session."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdc_pipeline.config import TableConfig
from cdc_pipeline.paths import TablePaths


@dataclass(frozen=True)
class StepContext:
    """A configured table, where its data lives, and the Spark session to process it."""

    spark: Any  # SparkSession; None for steps that need no Spark (vacuum)
    table: TableConfig
    paths: TablePaths
