"""The seed's second architecture for real: PostgreSQL 15 -> Debezium Server (its Kafka sink) ->
a Kafka broker (one topic per table, 3 partitions) -> the real `cdc run` of Kafka tables, every
final and history table compared with the source database at each checkpoint, a run killed
during stage and one killed during overwrite-final rerun exactly."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from tests import debezium, postgres
from tests.cli.cdc import cdc
from tests.cli.source_checks import SCHEMA, check_equal, run, table_configs, workload
from tests.helpers import Workspace
from tests.kafka import KafkaBroker

pytestmark = [pytest.mark.cli, pytest.mark.slow]

TABLES = ("docs", "sessions")


def checkpoint(pg: postgres.Postgres, broker: KafkaBroker, hour: int, log: Path) -> None:
    """Wait until Debezium has sent everything committed so far (a marker row written last)."""
    pg.sql(f"INSERT INTO marker VALUES ({hour});")
    debezium.wait_for_event(
        broker,
        "marker",
        lambda e: e.payload is not None and (e.payload["after"] or {}).get("id") == hour,
        log,
    )


def test_final_and_history_equal_the_source_database_through_kafka(
    workspace: Workspace,
    postgres_server: postgres.Postgres,
    kafka_broker: KafkaBroker,
    connect_server: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reason = debezium.available()
    if reason:
        pytest.fail(reason)
    monkeypatch.setenv("CDC_KAFKA_BOOTSTRAP_SERVERS", kafka_broker.bootstrap_servers)
    pg = postgres_server.create_database("debezium_kafka_source")
    pg.sql(SCHEMA + "CREATE TABLE marker (id int PRIMARY KEY);")
    rows = [{**row, "source": "kafka", "topic": row["name"]} for row in table_configs("debezium")]
    workspace.configure(*rows)
    rng = random.Random(20261128)
    ids: list[int] = []
    url = connect_server.url
    workload(pg, rng, 0, ids)  # before capture starts: the connector's snapshot (op r)
    work = tmp_path / "debezium"
    log = work / "debezium.log"
    source = {"skipped.operations": "none", "decimal.handling.mode": "string"}
    captured = [*TABLES, "marker"]
    for _ in debezium.running_to_kafka(pg, work, kafka_broker, captured, partitions=3, **source):
        checkpoint(pg, kafka_broker, 0, log)
        for table in TABLES:
            run(workspace, url, table, 0, 1)
        check_equal(workspace, pg, "after the snapshot")
        workload(pg, rng, 1, ids)
        checkpoint(pg, kafka_broker, 1, log)
        # Killed during stage (after quarantine, before staging's commit) and during
        # overwrite-final (before final's commit): each rerun applies every message once.
        for table, point in (
            ("docs", "stage:before_staging_commit"),
            ("sessions", "overwrite_final:before_commit"),
        ):
            killed = cdc(
                workspace,
                "run",
                table,
                "--start",
                "2024-03-01T01:00Z",
                "--end",
                "2024-03-01T02:00Z",
                CDC_SPARK_REMOTE=url,
                CDC_FAULT=point,
                timeout=600,
            )
            assert killed.returncode != 0, point
        for table in TABLES:
            run(workspace, url, table, 1, 2)
        check_equal(workspace, pg, "hour 1, after the killed runs")
        workload(pg, rng, 2, ids)
        pg.sql("UPDATE docs SET title = 'all ' || id;")  # the placeholder for every body
        checkpoint(pg, kafka_broker, 2, log)
        for table in TABLES:
            counts = run(workspace, url, table, 2, 3)
        check_equal(workspace, pg, "hour 2, title-only updates of every row")
        assert int(counts["staged"]) > 0
        checked = cdc(workspace, "check", *TABLES, CDC_SPARK_REMOTE=url, timeout=600)
        assert checked.returncode == 0, checked.stdout + checked.stderr[-2000:]
