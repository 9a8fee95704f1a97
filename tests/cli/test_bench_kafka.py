"""`cdc bench --kafka-messages`: the stage step of a `source: kafka` table over the bench's
messages on a real broker stages every message, each run into a fresh table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdc_tools.bench.kafka_stage import measure_kafka_staging
from cdc_tools.bench.merges import BenchSpec
from tests.kafka import KafkaBroker

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_the_bench_stages_every_message_and_reports_messages_per_second(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    spec = BenchSpec(
        partitions=10, key_width=2, kafka_messages=500, repeats=2, warm_up_runs=0, output=tmp_path
    )
    lines: list[str] = []

    # Fails when a run stages other than the 500 messages (counted and in staging).
    result = measure_kafka_staging(spark, spec, tmp_path, broker=kafka_broker, log=lines.append)

    assert result["staged_rows"] == 500
    assert len(result["runs"]) == 2 and result["warm_up_runs"] == []
    assert result["messages_per_second"] == pytest.approx(500 / result["stage_seconds"], rel=0.02)
    assert any("500 messages sent" in line for line in lines)
    assert not list(tmp_path.glob("kafka-*"))  # every run's table removed after it
