"""A real Debezium Server (PostgreSQL connector, pgoutput) on the tests' PostgreSQL 15, its record
values landed as a Kafka Connect S3 sink would write them, applied with the real `cdc run`, and
every final and history table compared with the source database at each checkpoint: the initial
snapshot (op r), unchanged TOASTed values (the connector's placeholder), primary-key changes
(a delete and a create sharing one LSN), bursts, truncates (op t) with inserts after them in one
transaction, deletes, decimals as text, and heartbeats kept out of the tables."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests import debezium, postgres
from tests.cli.cdc import cdc
from tests.cli.source_checks import SCHEMA, check_equal, run, table_configs, workload
from tests.helpers import Workspace

pytestmark = [pytest.mark.cli, pytest.mark.slow]

TABLES = ("docs", "sessions")


def checkpoint(
    pg: postgres.Postgres, collector: debezium.Collector, workspace: Workspace, hour: int, log: Path
) -> None:
    """Wait until Debezium has sent everything committed so far (a marker row written last),
    then land each table's values in the hour's folder."""
    pg.sql(f"INSERT INTO marker VALUES ({hour});")
    debezium.wait_for(
        collector, "marker", lambda e: (e["payload"]["after"] or {}).get("id") == hour, log
    )
    collector.take("marker")
    for table in TABLES:
        lines = collector.take(table)
        folder = workspace.landing / table / f"dt=2024-03-01/hr={hour:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{table}+0+{hour:010d}.json").write_text("".join(f"{x}\n" for x in lines))


def landed(workspace: Workspace, table: str, hour: int) -> list[str]:
    folder = workspace.landing / table / f"dt=2024-03-01/hr={hour:02d}"
    return [
        line for path in sorted(folder.glob("*.json")) for line in path.read_text().splitlines()
    ]


def test_final_and_history_equal_the_source_database(
    workspace: Workspace,
    postgres_server: postgres.Postgres,
    connect_server: Any,
    tmp_path: Path,
) -> None:
    reason = debezium.available()
    if reason:
        pytest.fail(reason)
    pg = postgres_server.create_database("debezium_source")
    pg.sql(SCHEMA + "CREATE TABLE marker (id int PRIMARY KEY);")
    workspace.configure(*table_configs("debezium"))
    rng = random.Random(20241125)
    ids: list[int] = []
    url = connect_server.url
    workload(pg, rng, 0, ids)  # before capture starts: the connector's snapshot (op r)
    work = tmp_path / "debezium"
    log = work / "debezium.log"
    source = {"skipped.operations": "none", "decimal.handling.mode": "string"}
    for collector in debezium.running(pg, work, **source):
        debezium.wait_for_snapshot(collector, log)
        checkpoint(pg, collector, workspace, 0, log)
        ops = [json.loads(line)["payload"]["op"] for line in landed(workspace, "docs", 0)]
        assert ops and set(ops) == {"r"}, set(ops)  # the snapshot
        for table in TABLES:
            run(workspace, url, table, 0, 1)
        check_equal(workspace, pg, "after the snapshot")
        for hour in range(1, 3):
            workload(pg, rng, hour, ids)
            checkpoint(pg, collector, workspace, hour, log)
            for table in TABLES:
                run(workspace, url, table, hour, hour + 1)
            check_equal(workspace, pg, f"hour {hour}")
        # Title-only updates of every row: the connector sends the placeholder for every body.
        pg.sql("UPDATE docs SET title = 'all ' || id;")
        checkpoint(pg, collector, workspace, 3, log)
        bodies = [
            json.loads(line)["payload"]["after"]["body"] for line in landed(workspace, "docs", 3)
        ]
        assert bodies and set(bodies) == {"__debezium_unavailable_value"}, set(bodies)
        run(workspace, url, "docs", 3, 4)
        check_equal(workspace, pg, "after title-only updates of every row")
        assert collector.heartbeats > 0  # heartbeats were sent, and landed nowhere
        checked = cdc(workspace, "check", *TABLES, CDC_SPARK_REMOTE=url, timeout=600)
        assert checked.returncode == 0, checked.stdout + checked.stderr[-2000:]
