"""`cdc bench --kafka-messages N`: messages staged per second from a Kafka topic.

The bench starts the bundled broker (`cdc_tools.kafka_broker`: KRaft, one node, `.tools/kafka`),
makes one topic (`kafka_partitions` partitions), sends it N change messages of the bench's table
(flat JSON with the flag column, keyed by the table's key, as `cdc bench-cycle --source kafka`
sends them), then runs the stage step of a `source: kafka` table over them on the bench's Spark
session: `spec.warm_up_runs` runs not counted, then `spec.repeats` counted, each into a fresh
table (new staging, quarantine and ledger), so every run reads all N messages. Each run must
stage exactly N rows. The figure is N over the median run's seconds; the broker is stopped by its
pid (its process group) at the end.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from cdc_pipeline.paths import TablePaths
from cdc_tools.bench.merges import (
    CHANGE_HOUR,
    CHANGE_WINDOW,
    SPREAD_MASK,
    SPREAD_MULTIPLIER,
    TABLE,
    BenchSpec,
    bench_table,
    timed_stage,
)
from cdc_tools.kafka_broker import KafkaBroker, available, start_broker
from spark_jobs import delta
from spark_jobs.runtime.context import StepContext

# What the `cdc` command reads the bootstrap servers from (cdc_pipeline.kafka_settings).
BOOTSTRAP_VARIABLE = "CDC_KAFKA_BOOTSTRAP_SERVERS"


def change_messages(spec: BenchSpec, count: int) -> list[tuple[str, str]]:
    """`count` changes of distinct keys as (key, flat JSON value): the mix of `change_rows`
    (85% updates, 5% moves among them as plain updates here, 5% inserts, 5% key-only deletes)."""
    stamp = CHANGE_HOUR.strftime("%Y-%m-%d %H:%M:%S")
    messages = []
    for n in range(count):
        first = n if spec.key_layout != "spread" else (n * SPREAD_MULTIPLIER) & SPREAD_MASK
        record: dict[str, Any] = {"K1": first}
        record.update({f"K{i}": n * i % 9973 for i in range(2, spec.key_width + 1)})
        kind = n % 20
        record["FLAG"] = "I" if kind == 18 else "D" if kind == 19 else "U"
        if record["FLAG"] != "D":
            record |= {
                "REGION": n % spec.partitions,
                "V1": n * 7 + 1,
                "V2": f"changed-{n}",
                "V3": n / 7.0,
            }
        record["TS"] = stamp
        messages.append((str(first), json.dumps(record)))
    return messages


def bootstrap_servers(servers: str) -> contextlib.AbstractContextManager[None]:
    """The stage's Kafka servers in this process's environment (as `cdc` reads them), restored
    after (the operator's `environment_applied`)."""
    from cdc_airflow.backends import environment_applied

    return environment_applied({BOOTSTRAP_VARIABLE: servers})


def kafka_unavailable() -> str | None:
    """Why the bundled broker cannot run here (None: it can)."""
    return available()


def stage_runs(
    spark: SparkSession, spec: BenchSpec, work: Path, broker: KafkaBroker, topic: str
) -> list[tuple[float, dict[str, Any]]]:
    """Every run of the stage step over the topic, each into a fresh table: (seconds, Spark
    jobs) per run, warm-up runs first. Fails when a run stages other than every message."""
    table = bench_table(spec, topic=topic)
    runs = []
    with bootstrap_servers(broker.bootstrap_servers):
        for run in range(spec.warm_up_runs + spec.repeats):
            folder = work / f"kafka-{run}"
            paths = TablePaths(TABLE, folder / "landing", folder / "warehouse")
            context = StepContext(spark, table, paths)
            report, seconds, stages = timed_stage(context, CHANGE_WINDOW, f"kafka/{run}")
            rows = delta.load_snapshot(paths.staging).num_records
            if report.result.staged != spec.kafka_messages or rows != spec.kafka_messages:
                raise RuntimeError(
                    f"bench: Kafka staging run {run}: {report.result.staged} staged, "
                    f"{rows} rows in staging, not the {spec.kafka_messages} messages sent"
                )
            runs.append((seconds, stages))
            shutil.rmtree(folder, ignore_errors=True)
    return runs


def measure_on(
    spark: SparkSession,
    spec: BenchSpec,
    work: Path,
    broker: KafkaBroker,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The measurement on a running broker: produce once, stage it every run; the figures."""
    topic = f"cdc-bench-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, spec.kafka_partitions)
    messages = change_messages(spec, spec.kafka_messages)
    started = time.perf_counter()
    broker.produce(topic, messages)
    produced = time.perf_counter() - started
    log(f"bench: {len(messages):,} messages sent to {topic} in {produced:.2f} s")
    runs = stage_runs(spark, spec, work, broker, topic)
    warm_up, counted = runs[: spec.warm_up_runs], runs[spec.warm_up_runs :]
    seconds = [s for s, _ in counted]
    median = statistics.median(seconds)
    by_time = sorted(counted, key=lambda r: r[0])
    return {
        "available": True,
        "messages": spec.kafka_messages,
        "topic_partitions": spec.kafka_partitions,
        "produce_seconds": round(produced, 2),
        "staged_rows": spec.kafka_messages,  # every run checked
        "stage_seconds": round(median, 2),
        "runs": seconds,
        "warm_up_runs": [s for s, _ in warm_up],
        "messages_per_second": round(spec.kafka_messages / median) if median else None,
        "spark": by_time[len(counted) // 2][1],
    }


def measure_kafka_staging(
    spark: SparkSession,
    spec: BenchSpec,
    work: Path,
    *,
    broker: KafkaBroker | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Messages staged per second (module docstring): on `broker`, or on a broker started for
    it under `work` and stopped by its pid after."""
    if broker is not None:
        return measure_on(spark, spec, work, broker, log)
    reason = kafka_unavailable()
    if reason is not None:
        raise RuntimeError(f"bench: --kafka-messages: the Kafka broker cannot run: {reason}")
    own = start_broker(work / "kafka-broker")
    log(f"bench: Kafka broker (pid {own.pid}) started in {own.started_in:.1f} s")
    try:
        result = measure_on(spark, spec, work, own, log)
    finally:
        own.stop()
    return result | {"broker_start_seconds": round(own.started_in, 2)}
