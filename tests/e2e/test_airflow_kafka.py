"""A Kafka table's DAG in a real Airflow of its own: `airflow dags test` reads the broker from
the Airflow connection kafka_default (never the config), stages the topic's messages and applies
them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.airflow_env import AirflowEnv
from tests.helpers import Workspace, table_rows

pytestmark = [pytest.mark.slow]

KAFKA_TOPIC = "t-kafka-e2e"


def kafka_row() -> dict[str, Any]:
    """A Kafka table (the broker from the row's default connection, kafka_default)."""
    fields = {
        "name": "t_kafka",
        "columns": {"ID": "bigint", "VALUE": "int", "TS": "timestamp"},
        "keys": ["ID"],
        "sequence_by": ["TS"],
        "vacuum_schedule": None,
        "reset_staging_schedule": None,
        "start_date": "2024-01-01",
    }
    return {**fields, "source": "kafka", "topic": KAFKA_TOPIC}


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AirflowEnv, Workspace]]:
    root = tmp_path_factory.mktemp("airflow_kafka")
    ws = Workspace(root)
    ws.config_path.write_text(yaml.safe_dump({"tables": [kafka_row()]}))
    env = AirflowEnv(root / "airflow_home", ws.config_path, ws.landing, ws.warehouse, log_dir=root)
    env.migrate()
    try:
        env.start_spark()
        yield env, ws
    finally:
        env.stop()


def test_dags_test_runs_a_kafka_table_through_its_connection(
    airflow: tuple[AirflowEnv, Workspace], kafka_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker comes from the Airflow connection kafka_default (never the config); stage reads
    the topic's messages and overwrite_final applies them (a run with nothing waiting is a no-op
    without Spark: tests/dags/test_connect_operator.py)."""
    env, ws = airflow
    kafka_broker.create_topic(KAFKA_TOPIC, 2)
    changes = [
        ({"FLAG": "I", "ID": 1, "VALUE": 1, "TS": "2024-01-01 00:00:01"}, 0),
        ({"FLAG": "I", "ID": 2, "VALUE": 2, "TS": "2024-01-01 00:00:02"}, 1),
        ({"FLAG": "U", "ID": 1, "VALUE": 3, "TS": "2024-01-01 00:00:03"}, 1),
    ]
    kafka_broker.produce(KAFKA_TOPIC, [(str(c["ID"]), json.dumps(c), p) for c, p in changes])
    extra = {"bootstrap.servers": kafka_broker.bootstrap_servers}
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "extra": extra})
    )
    monkeypatch.delenv("CDC_KAFKA_BOOTSTRAP_SERVERS", raising=False)
    result = env.airflow("dags", "test", "cdc_t_kafka", "2024-01-01T01:00:00+00:00")
    output = result.stdout + result.stderr
    assert (
        "CDC summary: stage t_kafka [2024-01-01T00:00:00Z, 2024-01-01T01:00:00Z): messages=3"
        in output
    )
    assert table_rows(ws.paths("t_kafka").final, ["ID", "VALUE"]) == [(1, 3), (2, 2)]
