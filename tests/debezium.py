"""A real Debezium Server (2.7.3.Final, unpacked by `make test` into .tools/debezium-server) on
the tests' PostgreSQL, with its HTTP sink posting every record value to a collector in the test
process. The collector keeps each table's values in order, as the JSON lines a Kafka Connect S3
sink writes for the table's topic (heartbeats go to their own topic: kept apart, never landed).
The server runs in its own process group and is stopped by its pid. `running_to_kafka` runs it
with its Kafka sink instead: one topic per table on the tests' broker (tests/kafka.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cdc_pipeline.config import project_root
from tests.helpers import stop_process_group
from tests.kafka import KafkaBroker
from tests.postgres import Postgres

DIST = project_root() / ".tools" / "debezium-server"


def available() -> str | None:
    """Why Debezium Server cannot run here (None: it can)."""
    if not list(DIST.glob("*runner.jar")):
        return f"{DIST} holds no Debezium Server (make test unpacks it: docker/debezium-pom.xml)"
    return None


@dataclass
class Collector:
    """The record values the HTTP sink posted, per table, in order."""

    lines: dict[str, list[str]] = field(default_factory=dict)
    heartbeats: int = 0
    snapshot_ended: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, body: str) -> None:
        value = json.loads(body) if body.strip() else None
        payload = value.get("payload", value) if isinstance(value, dict) else None
        source = (payload or {}).get("source") or {}
        with self.lock:
            if source.get("snapshot") == "last":  # the initial snapshot's last record
                self.snapshot_ended = True
            if "table" not in source:
                self.heartbeats += 1
                return
            self.lines.setdefault(source["table"], []).append(body.strip())

    def take(self, table: str) -> list[str]:
        """The table's values collected since the last take."""
        with self.lock:
            return self.lines.pop(table, [])

    def seen(self, table: str, predicate: Any) -> bool:
        with self.lock:
            return any(predicate(json.loads(line)) for line in self.lines.get(table, []))


def _handler(collector: Collector) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            collector.add(self.rfile.read(length).decode())
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def source_settings(pg: Postgres, work: Path, **source: str) -> dict[str, str]:
    """The server's settings but its sink's: JSON keys and values (with the schema envelope),
    the PostgreSQL connector on `pg`'s database (initial snapshot, then streaming with pgoutput;
    topic prefix: the database), file offsets in `work`; `source` adds connector settings."""
    return {
        "debezium.format.value": "json",
        "debezium.format.key": "json",
        "debezium.source.connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "debezium.source.offset.storage.file.filename": str(work / "offsets.dat"),
        "debezium.source.offset.flush.interval.ms": "0",
        "debezium.source.database.hostname": "127.0.0.1",
        "debezium.source.database.port": str(pg.port),
        "debezium.source.database.user": "postgres",
        "debezium.source.database.password": "unused",
        "debezium.source.database.dbname": pg.database,
        "debezium.source.topic.prefix": pg.database,
        "debezium.source.plugin.name": "pgoutput",
        "debezium.source.slot.name": f"dbz_{pg.database}",
        "debezium.source.publication.autocreate.mode": "all_tables",
        "debezium.source.publication.name": f"dbz_{pg.database}",
        "debezium.source.heartbeat.interval.ms": "1000",
        "quarkus.http.port": "0",
        "quarkus.log.console.json": "false",
        **{f"debezium.source.{k}": v for k, v in source.items()},
    }


def launch(work: Path, settings: dict[str, str]) -> subprocess.Popen[bytes]:
    """Write `settings` to work/config/application.properties and start the server there in
    its own process group, its output in work/debezium.log."""
    (work / "config").mkdir(parents=True, exist_ok=True)
    escaped = {k: v.replace("\\", "\\\\") for k, v in settings.items()}  # an escape there
    (work / "config" / "application.properties").write_text(
        "".join(f"{k}={v}\n" for k, v in escaped.items())
    )
    runner = next(DIST.glob("*runner.jar"))
    classpath = os.pathsep.join([str(runner), str(DIST / "conf"), str(DIST / "lib" / "*")])
    with (work / "debezium.log").open("w") as log:
        return subprocess.Popen(
            ["java", "-cp", classpath, "io.debezium.server.Main"],
            cwd=work,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def running(pg: Postgres, work: Path, **source: str) -> Iterator[Collector]:
    """Debezium Server capturing `pg`'s database (initial snapshot, then streaming with
    pgoutput), its values in the collector; `source` adds connector settings."""
    collector = Collector()
    http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(collector))
    threading.Thread(target=http.serve_forever, daemon=True).start()
    settings = {
        "debezium.sink.type": "http",
        "debezium.sink.http.url": f"http://127.0.0.1:{http.server_address[1]}/",
        **source_settings(pg, work, **source),
    }
    process = launch(work, settings)
    try:
        yield collector
    finally:
        stop_process_group(process, timeout=60)
        http.shutdown()


def wait_for_snapshot(collector: Collector, log: Path, timeout: float = 120) -> None:
    """Wait until the connector has sent the last record of its initial snapshot. A marker row
    written before the snapshot reads its table is itself a snapshot record, sent before the
    tables that sort after it: waiting for the marker alone can land an unfinished snapshot."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if collector.snapshot_ended:
            return
        time.sleep(0.2)
    tail = log.read_text()[-3000:] if log.exists() else ""
    raise AssertionError(f"Debezium's snapshot did not end in {timeout:.0f} s:\n{tail}")


def wait_for(
    collector: Collector, table: str, predicate: Any, log: Path, timeout: float = 120
) -> None:
    """Wait until the collector holds a value of `table` matching `predicate`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if collector.seen(table, predicate):
            return
        time.sleep(0.2)
    tail = log.read_text()[-3000:] if log.exists() else ""
    raise AssertionError(f"Debezium sent no matching {table} event in {timeout:.0f} s:\n{tail}")


HEARTBEAT_TOPIC_PREFIX = "__debezium-heartbeat"  # the connector's topic.heartbeat.prefix default
STRING_SERIALIZER = "org.apache.kafka.common.serialization.StringSerializer"


def running_to_kafka(
    pg: Postgres,
    work: Path,
    broker: KafkaBroker,
    tables: Iterable[str],
    partitions: int = 1,
    topic_prefix: str = "",
    **source: str,
) -> Iterator[subprocess.Popen[bytes]]:
    """Debezium Server with its Kafka sink, capturing `tables` (schema public) of `pg`'s database
    into one topic per table on `broker`, named `topic_prefix` + the table (a RegexRouter drops
    the `{database}.public.` of Debezium's own names). The topics (`partitions` each; the key's
    hash picks one) and the heartbeat topic are created first: the tests' broker creates none
    itself. Values and keys are JSON with the schema envelope; a delete is followed by its
    tombstone (a null value). Yields the server's process, stopped by its pid at the end."""
    names = list(tables)
    for table in names:
        broker.create_topic(f"{topic_prefix}{table}", partitions)
    heartbeats = f"{HEARTBEAT_TOPIC_PREFIX}.{pg.database}"
    if heartbeats not in broker.admin().list_topics(timeout=10).topics:
        broker.create_topic(heartbeats, 1)
    settings = {
        "debezium.sink.type": "kafka",
        "debezium.sink.kafka.producer.bootstrap.servers": broker.bootstrap_servers,
        "debezium.sink.kafka.producer.key.serializer": STRING_SERIALIZER,
        "debezium.sink.kafka.producer.value.serializer": STRING_SERIALIZER,
        "debezium.sink.kafka.producer.acks": "all",
        "debezium.sink.kafka.producer.enable.idempotence": "true",
        "debezium.transforms": "topic",
        "debezium.transforms.topic.type": "org.apache.kafka.connect.transforms.RegexRouter",
        "debezium.transforms.topic.regex": r"[^.]+\.public\.(.+)",
        "debezium.transforms.topic.replacement": f"{topic_prefix}$1",
        **source_settings(
            pg,
            work,
            **{"table.include.list": ",".join(rf"public\.{re.escape(t)}" for t in names), **source},
        ),
    }
    process = launch(work, settings)
    try:
        yield process
    finally:
        stop_process_group(process, timeout=60)


@dataclass
class Event:
    """One record of a table's topic: where it is, its key and value (None: a tombstone)."""

    partition: int
    offset: int
    key: Any
    value: Any

    @property
    def payload(self) -> Any:
        """The change (op, before, after, source), with or without the schema envelope."""
        if self.value is None:
            return None
        return self.value.get("payload", self.value)


def decoded(records: Iterable[tuple[int, int, bytes | None, bytes | None]]) -> list[Event]:
    """Records of a topic (KafkaBroker.read) with their JSON key and value (None: a tombstone)."""
    return [
        Event(p, o, json.loads(k) if k else None, json.loads(v) if v is not None else None)
        for p, o, k, v in records
    ]


def wait_for_event(
    broker: KafkaBroker, topic: str, predicate: Any, log: Path, timeout: float = 120
) -> list[Event]:
    """Wait until `topic` holds a record for which `predicate(event)` is true; its records."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = decoded(broker.read(topic))
        if any(predicate(e) for e in events):
            return events
        time.sleep(0.5)
    tail = log.read_text()[-3000:] if log.exists() else ""
    raise AssertionError(f"Debezium sent no matching {topic} record in {timeout:.0f} s:\n{tail}")
