"""The steps' OpenLineage lineage, for the OpenLineage provider's operator hook
(`get_openlineage_facets_on_complete`): what each step read and wrote, as datasets named by the
OpenLineage naming spec, so a lineage graph (Marquez, DataHub, Unity) connects the landing folder
or Kafka topic -> staging -> final -> the DAGs scheduled on the table's asset.

Datasets: a folder is `file` + its absolute path, or `s3://<bucket>` + its key; a topic is
`kafka://<first bootstrap server>` + its name. An output carries its schema (the Delta table's
columns) and, where the step counts them, the rows it wrote.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cdc_pipeline.counts import OverwriteCounts, StageCounts, count
from cdc_pipeline.kafka_settings import BOOTSTRAP, properties_from_environment
from cdc_pipeline.paths import Location, ObjectPath, TablePaths

log = logging.getLogger(__name__)

# What each step reads and writes, by the table's folders (`source`: its landing folder or its
# topic); vacuum only deletes files no version refers to.
READS_WRITES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "stage": (("source",), ("staging", "quarantine")),
    "overwrite_final": (("staging",), ("final",)),
    "reset_staging": (("final",), ("staging",)),
    "optimize": (("final",), ("final",)),
    "check": (("final",), ()),
}


@dataclass(frozen=True)
class LineageDataset:
    """One dataset: its OpenLineage namespace and name; an output's columns and rows written."""

    namespace: str
    name: str
    fields: tuple[tuple[str, str], ...] = ()  # (column, type), the schema facet
    rows: int | None = None  # the output statistics facet


@dataclass(frozen=True)
class StepLineage:
    """What one run of a step read and wrote."""

    inputs: tuple[LineageDataset, ...]
    outputs: tuple[LineageDataset, ...]


def folder_dataset(location: Location) -> LineageDataset:
    """A table's folder: `file` + absolute path, or `s3://bucket` + key (the naming spec)."""
    if isinstance(location, ObjectPath):
        return LineageDataset(f"s3://{location.bucket}", location.key)
    return LineageDataset("file", str(location.resolve()))


def topic_dataset(bootstrap_servers: str, topic: str) -> LineageDataset:
    """A Kafka topic: `kafka://<host:port>` of the first bootstrap server + the topic."""
    first = bootstrap_servers.split(",")[0].strip()
    return LineageDataset(f"kafka://{first}", topic)


def rows_written(step: str, role: str, counts: Mapping[str, Any]) -> int | None:
    """The rows the step wrote into the folder `role`, where it counts them."""
    if step == "stage" and role in ("staging", "quarantine"):
        staged = StageCounts.of_payload(dict(counts))
        return count(staged.staged if role == "staging" else staged.quarantined)
    if step == "overwrite_final" and role == "final":
        return count(OverwriteCounts.of_payload(dict(counts)).rows_written)
    return None


def step_lineage(
    step: str,
    paths: TablePaths,
    source: LineageDataset,
    counts: Mapping[str, Any],
    columns_of: Callable[[Location], tuple[tuple[str, str], ...]],
) -> StepLineage:
    """A run's lineage from its counts; `columns_of` reads an output's schema."""
    reads, writes = READS_WRITES.get(step, ((), ()))

    def located(role: str) -> LineageDataset:
        return source if role == "source" else folder_dataset(getattr(paths, role))

    outputs = []
    for role in writes:
        dataset = located(role)
        folder = getattr(paths, role)
        outputs.append(
            LineageDataset(
                dataset.namespace,
                dataset.name,
                columns_of(folder),
                rows_written(step, role, counts),
            )
        )
    return StepLineage(tuple(located(role) for role in reads), tuple(outputs))


def delta_columns(location: Location) -> tuple[tuple[str, str], ...]:
    """The Delta table's columns and types (none when it does not exist yet)."""
    from spark_jobs.delta.reading import open_table

    table = open_table(location)
    if table is None:
        return ()
    fields = json.loads(table.schema().to_json())["fields"]
    return tuple(
        (f["name"], f["type"] if isinstance(f["type"], str) else json.dumps(f["type"]))
        for f in fields
    )


def table_source(table: str, config_path: str | None, paths: TablePaths) -> LineageDataset:
    """The table's source: its landing folder, or for a Kafka table its topic at the broker of
    the task's environment (the connection's CDC_KAFKA_* variables, applied by the operator)."""
    from cdc_pipeline.config import load_table_configs

    row = load_table_configs(config_path).table(table)
    if row.source == "kafka" and row.topic:
        servers = properties_from_environment(os.environ).get(BOOTSTRAP, "")
        return topic_dataset(servers or "unknown", row.topic)
    return folder_dataset(paths.landing)


def lineage_enabled() -> bool:
    """Whether the OpenLineage provider sends events (`[openlineage]` has a transport)."""
    try:
        from airflow.providers.openlineage.conf import is_disabled
    except ImportError:  # an Airflow without the provider
        return False
    return not is_disabled()


def run_lineage(
    step: str, table: str, config_path: str | None, report: Mapping[str, Any]
) -> StepLineage | None:
    """A successful run's lineage, read in the task's process while the object store's variables
    apply: the provider's listener calls the operator's hook in a forked process, where
    delta-rs (its runtime does not survive a fork) cannot read a schema. None when no lineage
    is sent, or when it cannot be read (logged; the task's outcome is the step's)."""
    if not lineage_enabled():
        return None
    try:
        paths = TablePaths.for_table(table)
        source = table_source(table, config_path, paths)
        return step_lineage(step, paths, source, report.get("counts") or {}, delta_columns)
    except Exception:
        log.exception("table %s: the lineage of %s is unreadable", table, step)
        return None


def operator_lineage(lineage: StepLineage | None) -> Any:
    """The run's lineage as the provider's OperatorLineage (empty when there is none)."""
    from airflow.providers.common.compat.openlineage.facet import (
        InputDataset,
        OutputDataset,
        OutputStatisticsOutputDatasetFacet,
        SchemaDatasetFacet,
        SchemaDatasetFacetFields,
    )
    from airflow.providers.openlineage.extractors import OperatorLineage

    if lineage is None:
        return OperatorLineage()

    def schema(dataset: LineageDataset) -> dict[str, Any]:
        fields = [SchemaDatasetFacetFields(name=n, type=t) for n, t in dataset.fields]
        return {"schema": SchemaDatasetFacet(fields=fields)} if fields else {}

    def output(dataset: LineageDataset) -> Any:
        statistics: dict[str, Any] = (
            {"outputStatistics": OutputStatisticsOutputDatasetFacet(rowCount=dataset.rows)}
            if dataset.rows is not None
            else {}
        )
        return OutputDataset(
            namespace=dataset.namespace,
            name=dataset.name,
            facets=schema(dataset),
            outputFacets=statistics,
        )

    return OperatorLineage(
        inputs=[InputDataset(namespace=d.namespace, name=d.name) for d in lineage.inputs],
        outputs=[output(d) for d in lineage.outputs],
    )
