"""A Kafka table through the real `cdc` command and a real broker: the same final and history as
the same changes landed as files, exactly once through crashes, reruns and overlapping runs,
tombstones, partitions added later, offsets lost to retention, a missing topic, a stopped broker."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.cli.cdc import cdc, start, summary
from tests.helpers import Workspace, exists, stop_process_group, table_rows
from tests.kafka import KafkaBroker, free_port

pytestmark = [pytest.mark.cli, pytest.mark.slow]

COLUMNS = {"ID": "bigint", "NAME": "string", "AMOUNT": "int", "TS": "timestamp"}
WINDOW = ("--start", "2024-01-01T00:00:00Z", "--end", "2024-01-01T01:00:00Z")


def kafka_row(name: str, topic: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "source": "kafka",
        "topic": topic,
        "change_format": "flat",
        "columns": COLUMNS,
        "keys": ["ID"],
        "sequence_by": ["TS"],
        **extra,
    }


def change(
    flag: str, id_: int, name: str | None = None, amount: int | None = None, second: int = 0
):
    row: dict[str, Any] = {"FLAG": flag, "ID": id_, "TS": f"2024-01-01 00:00:{second:02d}"}
    if name is not None:
        row["NAME"] = name
    if amount is not None:
        row["AMOUNT"] = amount
    return row


def new_topic(broker: KafkaBroker, partitions: int = 3) -> str:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions)
    return topic


def send(broker: KafkaBroker, topic: str, changes: list[tuple[dict[str, Any] | None, int]]) -> None:
    """Each change (None: a tombstone) to the partition given, in order."""
    broker.produce(
        topic,
        [
            (str(c["ID"]) if c else "k", json.dumps(c) if c is not None else None, p)
            for c, p in changes
        ],
    )


def kafka_cdc(workspace: Workspace, broker: KafkaBroker, *args: str, **env: str):
    return cdc(
        workspace, *args, CDC_KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap_servers, timeout=300, **env
    )


def run(workspace: Workspace, broker: KafkaBroker, table: str, **env: str) -> dict[str, str]:
    result = kafka_cdc(workspace, broker, "run", table, *WINDOW, **env)
    assert result.returncode == 0, result.stderr
    return summary(result)


def final(workspace: Workspace, table: str) -> list[tuple[Any, ...]]:
    path = workspace.paths(table).final
    return sorted(table_rows(path, list(COLUMNS))) if exists(path) else []


def history(workspace: Workspace, table: str) -> list[tuple[Any, ...]]:
    columns = [*COLUMNS, "_cdc_valid_from", "_cdc_valid_to", "_cdc_is_current", "_cdc_is_deleted"]
    return sorted(table_rows(workspace.paths(table).history, columns), key=repr)


# Two batches of changes: updates, a key-only delete, a delete then an older change of the
# same key arriving later (a remembered delete), a key whose changes are spread over partitions
# in the reverse of their order (the sequence decides, never the offsets), a duplicate.
BATCHES = [
    [
        (change("I", 1, "a", 10, 1), 0),
        (change("I", 2, "b", 20, 2), 1),
        (change("U", 1, "a2", 11, 5), 2),
        (change("I", 3, "c", 30, 3), 0),
        (change("U", 1, "a1", 12, 4), 0),  # older than the U at 5 in partition 2
        (change("I", 4, "d", 40, 6), 1),
        (change("I", 4, "d", 40, 6), 1),  # a duplicate
    ],
    [
        (change("D", 2, second=10), 2),  # key only
        (change("U", 3, "c2", 31, 11), 1),
        (change("I", 2, "b-old", 21, 7), 0),  # older than its delete: stays deleted
        (change("D", 4, "d", 40, 12), 0),
        (change("I", 5, "e", 50, 13), 2),
    ],
]


def test_a_kafka_table_equals_the_same_changes_landed_as_files(
    workspace: Workspace, kafka_broker: KafkaBroker
) -> None:
    topic = new_topic(kafka_broker)
    files_row = {
        "name": "f",
        "file_format": "json",
        "columns": COLUMNS,
        "keys": ["ID"],
        "sequence_by": ["TS"],
        "history": True,
    }
    workspace.configure(files_row, kafka_row("k", topic, history=True))
    for number, batch in enumerate(BATCHES):
        # The files table gets the same changes, one file per partition.
        for partition in sorted({p for _, p in batch}):
            rows = [c for c, p in batch if p == partition]
            workspace.land("f", "2024-01-01T00", f"b{number}-p{partition}.json", rows, "json")
        send(kafka_broker, topic, batch)
        assert cdc(workspace, "run", "f", *WINDOW).returncode == 0
        counts = run(workspace, kafka_broker, "k")
        assert counts["staged"] == str(len(batch))
        assert final(workspace, "k") == final(workspace, "f")
        assert history(workspace, "k") == history(workspace, "f")
    assert [r[:3] for r in final(workspace, "k")] == [(1, "a2", 11), (3, "c2", 31), (5, "e", 50)]
    # Nothing new: a run stages no message and changes nothing.
    again = kafka_cdc(workspace, kafka_broker, "stage", "k", *WINDOW)
    assert again.returncode == 0, again.stderr
    assert summary(again)["messages"] == "0"
    status = kafka_cdc(workspace, kafka_broker, "status", "k", "--json")
    document = json.loads(status.stdout)["tables"][0]
    assert (document["messages_waiting"], document["partitions"]) == (0, 3)


def test_tombstones_are_skipped_and_counted_and_a_partition_added_later_is_read_from_its_start(
    workspace: Workspace, kafka_broker: KafkaBroker
) -> None:
    topic = new_topic(kafka_broker, partitions=2)
    workspace.configure(kafka_row("k", topic))
    send(
        kafka_broker,
        topic,
        [(change("I", 1, "a", 1, 1), 0), (None, 0), (change("I", 2, "b", 2, 2), 1)],
    )
    staged = kafka_cdc(workspace, kafka_broker, "stage", "k", *WINDOW)
    assert staged.returncode == 0, staged.stderr
    counts = summary(staged)
    assert (counts["messages"], counts["staged"], counts["tombstones_skipped"]) == ("3", "2", "1")
    kafka_broker.add_partitions(topic, 3)
    send(kafka_broker, topic, [(change("I", 3, "c", 3, 3), 2), (change("U", 1, "a2", 4, 4), 2)])
    run(workspace, kafka_broker, "k")
    assert [r[:3] for r in final(workspace, "k")] == [(1, "a2", 4), (2, "b", 2), (3, "c", 3)]


def test_starting_offsets_latest_reads_only_what_arrives_after_the_first_run(
    workspace: Workspace, kafka_broker: KafkaBroker
) -> None:
    topic = new_topic(kafka_broker, partitions=1)
    workspace.configure(kafka_row("k", topic, starting_offsets="latest"))
    send(kafka_broker, topic, [(change("I", 1, "before", 1, 1), 0)])
    first = run(workspace, kafka_broker, "k")
    assert first["staged"] == "0"
    send(kafka_broker, topic, [(change("I", 2, "after", 2, 2), 0)])
    run(workspace, kafka_broker, "k")
    assert [r[:2] for r in final(workspace, "k")] == [(2, "after")]


def test_an_insert_only_kafka_table_never_applies_a_message_twice(
    workspace: Workspace, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """Crashes at every commit of stage and before final's, reruns and two runs at once:
    an insert-only table shows any double apply as a duplicate row."""
    topic = new_topic(kafka_broker)
    workspace.configure(kafka_row("k", topic, insert_only=True))
    sent: list[int] = []

    def batch(first: int, count: int) -> None:
        changes = [(change("I", i, f"n{i}", i, i % 60), i % 3) for i in range(first, first + count)]
        send(kafka_broker, topic, changes)
        sent.extend(range(first, first + count))

    batch(0, 12)
    for point in (
        "stage:before_first_write",
        "stage:before_staging_commit",
        "stage:before_ledger_commit",
        "overwrite_final:before_commit",
    ):
        crashed = kafka_cdc(workspace, kafka_broker, "run", "k", *WINDOW, CDC_FAULT=point)
        assert crashed.returncode != 0, point
        run(workspace, kafka_broker, "k")
        batch(len(sent), 5)
    # Two runs at once, from the same staging snapshot (a barrier before the staging commit).
    barrier = f"stage:before_staging_commit|{tmp_path / 'barrier'}|2"
    runs = [
        start(
            workspace,
            "run",
            "k",
            *WINDOW,
            CDC_KAFKA_BOOTSTRAP_SERVERS=kafka_broker.bootstrap_servers,
            CDC_BARRIER=barrier,
        )
        for _ in range(2)
    ]
    for process in runs:
        try:
            _, err = process.communicate(timeout=300)
        finally:
            stop_process_group(process)
        assert process.returncode == 0, err
    run(workspace, kafka_broker, "k")
    ids = [r[0] for r in final(workspace, "k")]
    assert [i for i, n in Counter(ids).items() if n > 1] == []
    assert sorted(ids) == sorted(sent)


def test_offsets_deleted_before_they_were_staged_fail_the_run_naming_them(
    workspace: Workspace, kafka_broker: KafkaBroker
) -> None:
    topic = new_topic(kafka_broker, partitions=1)
    workspace.configure(kafka_row("k", topic))
    send(kafka_broker, topic, [(change("I", i, "x", i, i), 0) for i in range(2)])
    run(workspace, kafka_broker, "k")
    send(kafka_broker, topic, [(change("I", i, "x", i, i), 0) for i in range(2, 5)])
    kafka_broker.delete_records(topic, {0: 4})  # retention took offsets 0..3; 2 and 3 unstaged
    failed = kafka_cdc(workspace, kafka_broker, "run", "k", *WINDOW)
    assert failed.returncode == 1
    line = failed.stderr.strip().splitlines()[-1]
    assert f"Kafka topic {topic!r}: 2 message(s) were deleted by the broker (retention)" in line
    assert "partition 0 offsets 2..3" in line and "accept_lost_offsets: true" in line
    assert [r[0] for r in final(workspace, "k")] == [0, 1]
    workspace.configure(kafka_row("k", topic, accept_lost_offsets=True))
    staged = kafka_cdc(workspace, kafka_broker, "stage", "k", *WINDOW)
    assert staged.returncode == 0, staged.stderr
    assert (summary(staged)["messages_lost"], summary(staged)["staged"]) == ("2", "1")
    run(workspace, kafka_broker, "k")
    assert [r[0] for r in final(workspace, "k")] == [0, 1, 4]


def test_a_missing_topic_or_a_stopped_broker_fails_with_one_line_and_the_retry_is_exact(
    workspace: Workspace, kafka_broker: KafkaBroker
) -> None:
    workspace.configure(kafka_row("k", "no-such-topic"))
    missing = kafka_cdc(workspace, kafka_broker, "run", "k", *WINDOW)
    assert missing.returncode == 2
    assert "Kafka topic 'no-such-topic'" in missing.stderr and "does not exist" in missing.stderr
    topic = new_topic(kafka_broker, partitions=1)
    workspace.configure(kafka_row("k", topic))
    send(kafka_broker, topic, [(change("I", 1, "a", 1, 1), 0)])
    nobody = f"127.0.0.1:{free_port()}"
    down = cdc(workspace, "run", "k", *WINDOW, CDC_KAFKA_BOOTSTRAP_SERVERS=nobody)
    assert down.returncode == 1
    assert re.search(
        rf"Kafka topic {re.escape(repr(topic))} at {re.escape(nobody)} is not reachable \(Failed "
        r"to get (metadata|watermark offsets): Local: (Broker transport failure|All broker "
        r"connections are down)\)$",
        down.stderr.strip().splitlines()[-1],
    )
    kafka_broker.restart()
    send(kafka_broker, topic, [(change("U", 1, "b", 2, 2), 0)])
    run(workspace, kafka_broker, "k")
    assert [r[:3] for r in final(workspace, "k")] == [(1, "b", 2)]


def test_reset_staging_keeps_the_offsets_staged(
    workspace: Workspace, kafka_broker: KafkaBroker
) -> None:
    """The offsets live in staging's log as txn actions: reset-staging's overwrite keeps them, so
    the next run stages only the new messages."""
    topic = new_topic(kafka_broker, partitions=2)
    workspace.configure(kafka_row("k", topic))
    send(kafka_broker, topic, [(change("I", 1, "a", 1, 1), 0), (change("I", 2, "b", 2, 2), 1)])
    run(workspace, kafka_broker, "k")
    reset = kafka_cdc(workspace, kafka_broker, "reset-staging", "k")
    assert reset.returncode == 0, reset.stderr
    send(kafka_broker, topic, [(change("U", 2, "b2", 3, 3), 1)])
    counts = run(workspace, kafka_broker, "k")
    assert counts["staged"] == "1"
    assert [r[:3] for r in final(workspace, "k")] == [(1, "a", 1), (2, "b2", 3)]


@pytest.mark.parametrize("reader", ["driver", "spark"])
def test_the_broker_stopped_during_the_read_fails_the_run_once_and_the_retry_is_exact(
    workspace: Workspace, kafka_broker: KafkaBroker, tmp_path: Path, reader: str
) -> None:
    """The run plans its ranges (the broker's end offsets), then the broker stops before they
    are read (on the driver, the small run's reader, or by Spark's source): the run fails with
    one line naming the topic and the servers, stages nothing; after the broker is back, the
    retry applies each message exactly once. (A barrier at the plan holds the run while the test
    stops the broker; the Java client's admin and request timeouts are cut to 5 s so its three
    tries take seconds, not three minutes.)"""
    limit = {"driver": "20000", "spark": "0"}[reader]
    topic = new_topic(kafka_broker, partitions=2)
    workspace.configure(kafka_row("k", topic))
    send(kafka_broker, topic, [(change("I", 1, "a", 1, 1), 0), (change("I", 2, "b", 2, 2), 1)])
    barrier = tmp_path / "barrier"
    process = start(
        workspace,
        "run",
        "k",
        *WINDOW,
        CDC_KAFKA_BOOTSTRAP_SERVERS=kafka_broker.bootstrap_servers,
        CDC_KAFKA_DEFAULT_API_TIMEOUT_MS="5000",
        CDC_KAFKA_REQUEST_TIMEOUT_MS="5000",
        CDC_BARRIER=f"stage:kafka_planned|{barrier}|2",
        CDC_DRIVER_READ_MESSAGES=limit,
    )
    try:
        until = time.monotonic() + 300
        while not (barrier.exists() and any(barrier.iterdir())) and time.monotonic() < until:
            assert process.poll() is None, process.communicate()[1]
            time.sleep(0.2)
        kafka_broker.stop()
        (barrier / "test").touch()  # the run goes on, to a broker that is gone
        _, stderr = process.communicate(timeout=600)
    finally:
        stop_process_group(process)
        if not kafka_broker.running:
            kafka_broker.restart()
    assert process.returncode == 1, stderr
    # The Java client's words vary with the call that timed out first (listNodes, a fetch,
    # ...); librdkafka's name the connection that failed.
    cause = {
        "driver": r"[^\n]*(Connect|connect|refused|down|timed out)[^\n]*",
        "spark": r"(TimeoutException|DisconnectException|NetworkException)[^\n]*",
    }[reader]
    said = re.escape(f"Kafka topic {topic!r} at {kafka_broker.bootstrap_servers}") + (
        rf" stopped answering during the read \({cause}\); nothing was staged: the retry reads "
        r"the same messages$"
    )
    assert re.search(said, stderr.strip().splitlines()[-1]), stderr[-3000:]
    assert (
        not exists(workspace.paths("k").staging)
        or table_rows(workspace.paths("k").staging, ["ID"]) == []
    )
    send(kafka_broker, topic, [(change("U", 1, "a2", 3, 3), 0)])
    counts = run(workspace, kafka_broker, "k")
    assert counts["staged"] == "3"
    assert [r[:3] for r in final(workspace, "k")] == [(1, "a2", 3), (2, "b", 2)]
