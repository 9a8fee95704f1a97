"""Debezium Server's Kafka sink puts PostgreSQL changes into one topic per table on the broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import debezium, postgres
from tests.kafka import KafkaBroker

pytestmark = [pytest.mark.slow]


def test_insert_update_delete_arrive_in_the_tables_topic_with_the_tombstone(
    postgres_server: postgres.Postgres, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    reason = debezium.available()
    if reason:
        pytest.fail(reason)
    pg = postgres_server.create_database("debezium_kafka")
    pg.sql(
        "CREATE TABLE items (id int PRIMARY KEY, name text);"
        "ALTER TABLE items REPLICA IDENTITY FULL;"  # whole rows in before
        "CREATE TABLE other (id int PRIMARY KEY);"  # not captured: no topic for it
        "INSERT INTO items VALUES (1, 'one');"
    )
    work = tmp_path / "debezium"
    log = work / "debezium.log"
    for _ in debezium.running_to_kafka(pg, work, kafka_broker, ["items"], partitions=3):
        debezium.wait_for_event(kafka_broker, "items", lambda e: e.payload["op"] == "r", log)
        pg.sql(
            "INSERT INTO items VALUES (2, 'two');"
            "UPDATE items SET name = 'TWO' WHERE id = 2;"
            "DELETE FROM items WHERE id = 2;"
            "INSERT INTO other VALUES (1);"
        )
        events = debezium.wait_for_event(
            kafka_broker, "items", lambda e: e.value is None and e.key["payload"]["id"] == 2, log
        )
    assert "other" not in kafka_broker.admin().list_topics(timeout=10).topics

    def changes(key: int) -> list[tuple[str | None, dict | None, dict | None]]:
        return [
            (e.payload["op"], e.payload["before"], e.payload["after"])
            if e.payload is not None
            else (None, None, None)  # the tombstone
            for e in events
            if e.key["payload"]["id"] == key
        ]

    assert changes(1) == [("r", None, {"id": 1, "name": "one"})]
    assert changes(2) == [
        ("c", None, {"id": 2, "name": "two"}),
        ("u", {"id": 2, "name": "two"}, {"id": 2, "name": "TWO"}),
        ("d", {"id": 2, "name": "TWO"}, None),
        (None, None, None),
    ]
    # One key, one partition (the key's hash), its changes in order of offset.
    key_2 = [e for e in events if e.key["payload"]["id"] == 2]
    assert len({e.partition for e in key_2}) == 1
    assert [e.offset for e in key_2] == sorted(e.offset for e in key_2)
    assert {e.payload["source"]["table"] for e in events if e.payload} == {"items"}
