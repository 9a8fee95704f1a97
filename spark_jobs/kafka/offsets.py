"""Which messages a Kafka table's run stages: per partition, from the offset the table last
staged to the end offset the broker had when the run started.

The offsets a table has staged live in staging's own Delta log, as one `txn` action per
partition (Delta's SetTransaction: app id `cdc-kafka/<topic>/<partition>`, version = the next
offset to stage), written by the same atomic commit that adds the messages' rows. The rows and
the offsets are therefore committed together or not at all: a crash before the commit leaves
both as they were (the retry reads the same messages again), a crash after it leaves both done
(the retry starts after them), and of two runs at once only one commit can follow the snapshot
both planned from (the other plans again from the new offsets). Txn actions are part of the
table's state: checkpoints, OPTIMIZE, VACUUM and reset-staging keep them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from cdc_pipeline.config import TableConfig
from cdc_pipeline.errors import LostMessagesError
from cdc_pipeline.intervals import batch_id
from spark_jobs import delta
from spark_jobs.kafka.broker import TopicOffsets

APP_PREFIX = "cdc-kafka"
FILE_PREFIX = "kafka-"


def app_id(topic: str, partition: int) -> str:
    """The Delta txn app id recording how far `topic`'s `partition` is staged."""
    return f"{APP_PREFIX}/{topic}/{partition}"


@dataclass(frozen=True, kw_only=True)
class OffsetRange:
    """Messages [start, end) of one partition, staged by one run."""

    partition: int
    start: int
    end: int

    @property
    def file(self) -> str:
        """The range's arrival name (`_cdc_file` of its rows, the ledger's file): names sort by
        partition, then start, so a partition's later messages arrive later."""
        return f"{FILE_PREFIX}{self.partition:05d}-{self.start:020d}-{self.end:020d}"

    @property
    def messages(self) -> int:
        """Offsets in the range (compaction and transaction markers may leave fewer messages)."""
        return self.end - self.start


def range_of_file(name: str) -> OffsetRange | None:
    """The range a `_cdc_file` or ledger name stands for (None: not a Kafka range)."""
    if not name.startswith(FILE_PREFIX):
        return None
    try:
        partition, start, end = (int(part) for part in name[len(FILE_PREFIX) :].split("-"))
    except ValueError:
        return None
    return OffsetRange(partition=partition, start=start, end=end)


@dataclass(frozen=True, kw_only=True)
class KafkaPlan:
    """What one run stages: the ranges (every partition whose recorded offset moves, empty
    ranges included: a first run or a new partition records where it starts), the messages
    lost to retention (accepted by the row), the staging batch its rows go to."""

    topic: str
    staging: delta.Snapshot
    batch: str
    ranges: list[OffsetRange] = field(default_factory=list)
    lost: int = 0

    @property
    def to_read(self) -> list[OffsetRange]:
        """The ranges holding messages."""
        return [r for r in self.ranges if r.messages > 0]

    @property
    def messages(self) -> int:
        """Offsets the run reads."""
        return sum(r.messages for r in self.ranges)


def staged_offsets(staging: delta.Snapshot, topic: str, partitions: list[int]) -> dict[int, int]:
    """The next offset to stage of each partition the table has recorded (others left out)."""
    if staging.table is None:
        return {}
    found = {}
    for partition in partitions:
        version = staging.table.transaction_version(app_id(topic, partition))
        if version is not None:
            found[partition] = int(version)
    return found


def plan_ranges(
    table: TableConfig, staging: delta.Snapshot, offsets: TopicOffsets, now: datetime
) -> KafkaPlan:
    """The run's ranges: from each partition's staged offset (a new partition: its earliest; a
    first run: per starting_offsets) to its end offset now. Offsets deleted before they were
    staged fail the run (LostMessagesError), unless the row accepts the loss."""
    topic = offsets.topic
    staged = staged_offsets(staging, topic, list(offsets.partitions))
    first_run = not staged
    ranges, lost, gaps = [], 0, []
    for partition, marks in offsets.partitions.items():
        start = staged.get(partition)
        if start is None:
            start = (
                marks.end if first_run and table.starting_offsets == "latest" else marks.earliest
            )
        if start > marks.end:
            raise LostMessagesError(
                f"table {table.name}: Kafka topic {topic!r} partition {partition} ends at offset "
                f"{marks.end}, before offset {start} the table staged up to: the topic was "
                "deleted and created again, or its messages removed. Staging and final are "
                "unchanged; rebuild the table from a new snapshot of the source (drop its "
                "warehouse folder) or point the row at the right topic"
            )
        if start < marks.earliest:
            gaps.append((partition, start, marks.earliest))
            if table.accept_lost_offsets:
                lost += marks.earliest - start
                start = marks.earliest
        if partition not in staged or marks.end > start:
            ranges.append(OffsetRange(partition=partition, start=start, end=marks.end))
    if gaps and not table.accept_lost_offsets:
        named = ", ".join(f"partition {p} offsets {a}..{b - 1}" for p, a, b in gaps)
        count = sum(b - a for _, a, b in gaps)
        raise LostMessagesError(
            f"table {table.name}: Kafka topic {topic!r}: {count} message(s) were deleted by the "
            f"broker (retention) before this table staged them: {named}. Nothing was staged. "
            "Re-snapshot the source (a Debezium incremental snapshot) and set "
            "accept_lost_offsets: true for the row to go on from the earliest offsets, or "
            "raise the topic's retention.ms"
        )
    hour = f"{now:%Y-%m-%d}", f"{now:%H}"
    return KafkaPlan(topic=topic, staging=staging, batch=batch_id(*hour), ranges=ranges, lost=lost)


@dataclass(frozen=True, kw_only=True)
class PartitionLag:
    """One partition: the next offset the table stages, the broker's end offset, and the
    messages between them (what waits)."""

    partition: int
    staged: int | None  # None: the table has not read the partition yet
    end: int
    waiting: int


def lag_of(
    table: TableConfig, staging: delta.Snapshot, offsets: TopicOffsets
) -> list[PartitionLag]:
    """What waits in each partition: from the staged offset (or where the next run would start)
    to the end offset."""
    staged = staged_offsets(staging, offsets.topic, list(offsets.partitions))
    lags = []
    for partition, marks in offsets.partitions.items():
        known = staged.get(partition)
        if known is not None:
            start = known
        elif not staged and table.starting_offsets == "latest":
            start = marks.end
        else:
            start = marks.earliest
        lags.append(
            PartitionLag(
                partition=partition,
                staged=known,
                end=marks.end,
                waiting=max(0, marks.end - max(start, marks.earliest)),
            )
        )
    return lags
