"""A real Debezium Server (2.7.3.Final, unpacked by `make test` into .tools/debezium-server) on
the tests' PostgreSQL, with its HTTP sink posting every record value to a collector in the test
process. The collector keeps each table's values in order, as the JSON lines a Kafka Connect S3
sink writes for the table's topic (heartbeats go to their own topic: kept apart, never landed).
The server runs in its own process group and is stopped by its pid.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cdc_pipeline.config import project_root
from tests.helpers import stop_process_group
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


def running(pg: Postgres, work: Path, **source: str) -> Iterator[Collector]:
    """Debezium Server capturing `pg`'s database (initial snapshot, then streaming with
    pgoutput), its values in the collector; `source` adds connector settings."""
    collector = Collector()
    http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(collector))
    threading.Thread(target=http.serve_forever, daemon=True).start()
    settings = {
        "debezium.sink.type": "http",
        "debezium.sink.http.url": f"http://127.0.0.1:{http.server_address[1]}/",
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
    (work / "config").mkdir(parents=True, exist_ok=True)
    (work / "config" / "application.properties").write_text(
        "".join(f"{k}={v}\n" for k, v in settings.items())
    )
    runner = next(DIST.glob("*runner.jar"))
    classpath = os.pathsep.join([str(runner), str(DIST / "conf"), str(DIST / "lib" / "*")])
    with (work / "debezium.log").open("w") as log:
        process = subprocess.Popen(
            ["java", "-cp", classpath, "io.debezium.server.Main"],
            cwd=work,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
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
