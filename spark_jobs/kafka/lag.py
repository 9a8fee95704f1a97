"""How far a Kafka table is behind its topic: the messages not staged yet and the age of the
oldest of them (`cdc status`, the CDC tables view, the freshness alert). Metadata only: the
broker's offsets and staging's log, one message's timestamp per lagging partition."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from cdc_pipeline.config import TableConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.kafka_settings import properties_from_environment, require_bootstrap
from cdc_pipeline.paths import TablePaths
from spark_jobs import delta
from spark_jobs.kafka import broker
from spark_jobs.kafka.offsets import lag_of


@dataclass(frozen=True, kw_only=True)
class TopicLag:
    """A Kafka table against its topic now; `error` says why the broker could not tell."""

    messages_waiting: int | None = None
    oldest_waiting: datetime | None = None  # the broker's time of the oldest unstaged message
    partitions: int | None = None
    error: str | None = None


def topic_lag(
    table: TableConfig, paths: TablePaths, properties: Mapping[str, str] | None = None
) -> TopicLag:
    """The table's lag behind its topic (an unreachable broker is reported, not raised);
    `properties` the client's (default: the environment's CDC_KAFKA_* variables)."""
    assert table.topic is not None
    try:
        if properties is None:
            properties = require_properties(table)
        else:
            require_bootstrap(properties, table.name, table.kafka_conn_id)
        offsets = broker.topic_offsets(properties, table.topic)
        lags = lag_of(table, delta.load_snapshot(paths.staging), offsets)
        waiting = {
            lag.partition: lag.staged
            if lag.staged is not None
            else offsets.partitions[lag.partition].earliest
            for lag in lags
            if lag.waiting > 0
        }
        times = broker.message_times(properties, table.topic, waiting)
    except CdcError as error:
        return TopicLag(error=str(error))
    return TopicLag(
        messages_waiting=sum(lag.waiting for lag in lags),
        oldest_waiting=min(times.values()) if times else None,
        partitions=len(lags),
    )


def kafka_has_work(table: TableConfig, paths: TablePaths) -> bool:
    """Whether the topic holds messages the table has not staged, or partitions it has not
    recorded (a broker that does not answer: SourceUnavailableError)."""
    assert table.topic is not None
    properties = require_properties(table)
    offsets = broker.topic_offsets(properties, table.topic)
    lags = lag_of(table, delta.load_snapshot(paths.staging), offsets)
    return any(lag.waiting > 0 or lag.staged is None for lag in lags)


def require_properties(table: TableConfig) -> dict[str, str]:
    """The table's client properties from the environment (a ConfigError without servers)."""
    properties = properties_from_environment(os.environ)
    require_bootstrap(properties, table.name, table.kafka_conn_id)
    return properties
