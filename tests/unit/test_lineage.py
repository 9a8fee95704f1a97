"""Each step's OpenLineage datasets as plain data, and as the provider's OperatorLineage."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_airflow.lineage import (
    LineageDataset,
    folder_dataset,
    operator_lineage,
    run_lineage,
    step_lineage,
    topic_dataset,
)
from cdc_pipeline.paths import ObjectPath, TablePaths

S3 = TablePaths("orders", ObjectPath("lake", "landing"), ObjectPath("lake", "warehouse"))
COLUMNS = (("ID", "long"), ("TS", "timestamp"))


def test_folders_and_topics_are_named_by_the_openlineage_naming_spec(tmp_path: Path) -> None:
    assert folder_dataset(ObjectPath("lake", "warehouse/orders/final")) == LineageDataset(
        "s3://lake", "warehouse/orders/final"
    )
    assert folder_dataset(tmp_path / "w") == LineageDataset("file", str(tmp_path / "w"))
    assert topic_dataset("b1:9092, b2:9092", "orders") == LineageDataset(
        "kafka://b1:9092", "orders"
    )


def test_stage_reads_the_source_and_overwrite_final_writes_final_with_its_rows() -> None:
    source = folder_dataset(S3.landing)
    stage = step_lineage(
        "stage", S3, source, {"staged": 5, "quarantined": 1}, lambda location: COLUMNS
    )
    assert stage.inputs == (LineageDataset("s3://lake", "landing/orders"),)
    assert stage.outputs == (
        LineageDataset("s3://lake", "warehouse/orders/staging", COLUMNS, 5),
        LineageDataset("s3://lake", "warehouse/orders/quarantine", COLUMNS, 1),
    )
    applied = step_lineage(
        "overwrite_final", S3, source, {"changes": 5, "rows_written": 4}, lambda _: COLUMNS
    )
    assert applied.inputs == (LineageDataset("s3://lake", "warehouse/orders/staging"),)
    assert applied.outputs == (LineageDataset("s3://lake", "warehouse/orders/final", COLUMNS, 4),)
    # A Kafka table's stage reads its topic; vacuum moves no data between datasets.
    kafka = step_lineage("stage", S3, topic_dataset("b1:9092", "orders"), {}, lambda _: ())
    assert kafka.inputs == (LineageDataset("kafka://b1:9092", "orders"),)
    assert step_lineage("vacuum", S3, source, {}, lambda _: ()).outputs == ()


def test_the_operator_hook_gives_the_providers_operator_lineage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "tables.yaml"
    config.write_text(
        "tables:\n- name: k\n  source: kafka\n  topic: k-changes\n  file_format: json\n"
        "  columns: {ID: bigint, TS: timestamp}\n  keys: [ID]\n  sequence_by: [TS]\n"
    )
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.setenv("CDC_KAFKA_BOOTSTRAP_SERVERS", "broker:9092")
    report = {"counts": {"staged": 3, "quarantined": 0}}
    # The provider's conf caches its transport: whether one is set is the provider's own test.
    monkeypatch.setattr("cdc_airflow.lineage.lineage_enabled", lambda: True)
    lineage = operator_lineage(run_lineage("stage", "k", str(config), report))
    (topic,) = lineage.inputs
    assert (topic.namespace, topic.name) == ("kafka://broker:9092", "k-changes")
    staging, quarantine = lineage.outputs
    assert quarantine.outputFacets["outputStatistics"].rowCount == 0
    assert staging.name == str((tmp_path / "warehouse" / "k" / "staging").resolve())
    assert staging.outputFacets["outputStatistics"].rowCount == 3
    assert staging.facets == {}  # no staging table yet: no schema to tell
    # Nothing read when no lineage is sent; the hook then gives none.
    monkeypatch.setattr("cdc_airflow.lineage.lineage_enabled", lambda: False)
    assert run_lineage("stage", "k", str(config), report) is None
    assert operator_lineage(None).inputs == operator_lineage(None).outputs == []
