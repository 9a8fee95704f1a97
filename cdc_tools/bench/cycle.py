"""`cdc bench-cycle`: N tables through ONE scheduling cycle of a real Airflow, per Spark mode.

A tool, not a Spark step: it writes change files with pyarrow, drives a local Airflow
(`LocalAirflow`: scheduler + LocalExecutor on SQLite) and, in Connect mode, one Spark Connect
server; it reads the results with delta-rs and the timings from Airflow's metadata DB.

The cycle is the scheduler's own: every table's DAG is unpaused at once, and the scheduler
creates the run of the latest complete hour (the DAGs do not catch up), whose landing folder
holds ~`changes` changes per table. A manual trigger or a backfill would not replace that run
but add to it (the scheduler still creates the scheduled one on unpause), doubling the load.
"""

from __future__ import annotations

import csv
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import yaml

from cdc_airflow.local.connect_driver import warms_up
from cdc_airflow.local.launcher import LOCAL_SPARK, LocalAirflow
from cdc_airflow.local.runs import MetadataDB, RunRow, TaskRow, wait_for_dag_runs
from cdc_pipeline.intervals import HourBatch
from cdc_tools.bench.processes import ProcessSampler
from cdc_tools.kafka_broker import KafkaBroker, start_broker

Mode = Literal["connect", "spark-submit"]
# Where the tables read their changes: landed files, or one Kafka topic each (flat JSON messages
# of the same change sets) on a broker the bench starts.
Source = Literal["files", "kafka"]
Kind = Literal["partitioned", "unpartitioned", "insert_only"]
KINDS: tuple[Kind, ...] = ("partitioned", "unpartitioned", "insert_only")
FILE_FORMATS: dict[Kind, str] = {
    "partitioned": "parquet",
    "unpartitioned": "json",
    "insert_only": "csv",
}
UPSERT_COLUMNS = {
    "ID": "bigint",
    "NAME": "string",
    "QTY": "int",
    "REGION": "string",
    "SEQ": "bigint",
}
EVENT_COLUMNS = {"ID": "bigint", "NAME": "string", "QTY": "int", "TS": "timestamp", "SEQ": "bigint"}
REGIONS = ("north", "south", "east", "west")
DAG_PREFIX = "cdc_bc"
# Both modes use the tables' default connection: LocalAirflow points spark_default at its own
# Spark Connect server (connect mode) or at a local[2] spark-submit connection.
CONN_ID = "spark_default"
# The tables' schedules a cycle can run on, in minutes: each divides the hour.
EVERY_CHOICES = (5, 10, 15, 30, 60)
TASK_IDS = ("stage", "overwrite_final", "reset_staging", "optimize", "vacuum")


class BenchCycleError(RuntimeError):
    """The cycle could not be run or measured (the message says which table or step)."""


@dataclass(frozen=True)
class CycleSpec:
    """What one `cdc bench-cycle` runs."""

    tables: int = 65
    changes: int = 300
    modes: tuple[Mode, ...] = ("connect", "spark-submit")
    parallelism: int | None = None  # task processes at once; None: LocalAirflow's
    every: int = 60  # the tables' schedule in minutes: 60 (@hourly), or */15 * * * * and the like
    output: Path = Path("bench-results/cycle")
    seed: int = 42
    timeout: float = 3600.0
    progress_every: float = 10.0
    warm: bool = True  # connect mode, one cycle: warm the server on copies of the tables first
    # Connect mode: the first cycle once the server's own warm-up (cdc_airflow.local.warm_up)
    # is done, not while it runs.
    await_server_warm_up: bool = True
    # Consecutive scheduled cycles on one server, new change sets landed between them (the
    # scheduler's steady state): the first is reported apart, the later ones as their median.
    cycles: int = 1
    auto_cdc: bool = False  # then the same change sets through AUTO CDC (cdc_tools.bench.auto_cdc)
    sources: tuple[Source, ...] = ("files",)
    kafka_conn_id: str = "kafka_default"  # the Airflow connection the Kafka tables name
    kafka_partitions: int = 3  # of each table's topic; a key's messages go to one partition

    @classmethod
    def smoke(cls, output: Path, modes: tuple[Mode, ...]) -> CycleSpec:
        """Three tables (one of each kind), 30 changes each."""
        return cls(tables=3, changes=30, modes=modes, output=output, timeout=600)

    def validate(self) -> None:
        """Raise ValueError naming the bad option."""
        if self.tables < 1:
            raise ValueError(f"--tables must be at least 1, not {self.tables}")
        if self.changes < 2:
            raise ValueError(f"--changes must be at least 2, not {self.changes}")
        if self.parallelism is not None and self.parallelism < 1:
            raise ValueError(f"--parallelism must be at least 1, not {self.parallelism}")
        if self.every not in EVERY_CHOICES:
            choices = ", ".join(map(str, EVERY_CHOICES))
            raise ValueError(f"--every must be one of {choices} (minutes), not {self.every}")
        if not self.sources or set(self.sources) - {"files", "kafka"}:
            raise ValueError(f"--source must be files, kafka or both, not {self.sources}")
        if self.kafka_partitions < 1:
            raise ValueError(f"Kafka topics need a partition, not {self.kafka_partitions}")
        if self.cycles < 1:
            raise ValueError(f"--cycles must be at least 1, not {self.cycles}")

    @property
    def warms_up(self) -> bool:
        """A synthetic warm-up pass before the cycle: only for a single warm cycle (with more,
        the first cycle is the server's warm-up, measured like every later one)."""
        return self.warm and self.cycles == 1

    @property
    def schedule(self) -> str:
        """The tables' schedule: 15-minute runs read the hourly folders' new files."""
        return "@hourly" if self.every == 60 else f"*/{self.every} * * * *"

    @property
    def period(self) -> timedelta:
        """One data interval."""
        return timedelta(minutes=self.every)


# ---------------------------------------------------------------- change sets and expectations


@dataclass(frozen=True)
class BenchTable:
    """One benchmark table: its kind and the change rows of the cycle's hour, in file order."""

    index: int
    kind: Kind
    rows: tuple[dict[str, Any], ...]

    @classmethod
    def without_rows(cls, index: int) -> BenchTable:
        """Table `index` (kinds take turns) with no change rows: its name, kind and config."""
        return cls(index, KINDS[index % len(KINDS)], ())

    @property
    def name(self) -> str:
        return f"bc{self.index:03d}_{self.kind[0]}"

    @property
    def dag_id(self) -> str:
        return f"cdc_{self.name}"

    @property
    def file_format(self) -> str:
        return FILE_FORMATS[self.kind]

    @property
    def final_columns(self) -> list[str]:
        """The final table's columns the check compares, partition column last."""
        if self.kind == "insert_only":
            return [*EVENT_COLUMNS, "TS_DATE"]
        if self.kind == "partitioned":
            return [*UPSERT_COLUMNS, "REGION_UP"]
        return list(UPSERT_COLUMNS)

    def config_row(self, conn_id: str, schedule: str = "@hourly") -> dict[str, Any]:
        """The table's row of the config table (maintenance never due: one cycle)."""
        row: dict[str, Any] = {
            "name": self.name,
            "schedule": schedule,
            "file_format": self.file_format,
            "columns": dict(EVENT_COLUMNS if self.kind == "insert_only" else UPSERT_COLUMNS),
            "keys": ["ID"],
            "sequence_by": ["SEQ"],
            "flag_column": "FLAG",
            "optimize_schedule": None,
            "vacuum_schedule": None,
            "reset_staging_schedule": None,
            "check_schedule": None,  # @daily by default: a cycle of the 00:00 hour ran it
            "start_date": "2024-01-01",
            "spark_conn_id": conn_id,
        }
        if self.kind == "partitioned":
            row |= {"partition_expression": "upper(REGION)", "partition_column": "REGION_UP"}
        if self.kind == "insert_only":
            row |= {
                "partition_expression": "to_date(TS)",
                "partition_column": "TS_DATE",
                "insert_only": True,
            }
        return row

    def topic(self, run: str) -> str:
        """The table's topic in run `run` (one broker serves every run: a topic each)."""
        return f"{DAG_PREFIX}.{run}.{self.name}"

    def kafka_config_row(
        self, conn_id: str, schedule: str, topic: str, kafka_conn_id: str = "kafka_default"
    ) -> dict[str, Any]:
        """The table's row reading `topic` (flat JSON changes) instead of the landing zone."""
        row = self.config_row(conn_id, schedule)
        del row["file_format"]  # a message's value is JSON
        return row | {
            "source": "kafka",
            "topic": topic,
            "kafka_conn_id": kafka_conn_id,
            "change_format": "flat",
        }

    def messages(self) -> list[tuple[str, str]]:
        """The change set as Kafka messages, in file order: (key, flat JSON value). The key is
        the ID (a key's changes share a partition); SEQ orders them, never the offsets."""
        return [
            (str(row["ID"]), json.dumps({k: _json_value(v) for k, v in row.items()}))
            for row in self.rows
        ]


def _json_value(value: Any) -> Any:
    """A timestamp as the landed CSV writes it (naive UTC text); other values as they are."""
    if isinstance(value, datetime):
        return naive_utc(value).strftime("%Y-%m-%d %H:%M:%S")
    return value


def generate_table(
    index: int, changes: int, hour: datetime, seed: int, *, cycle: int = 0
) -> BenchTable:
    """Table `index`'s change set of cycle `cycle`: kinds take turns; the same arguments give the
    same rows. A later cycle's changes come after the earlier ones' (SEQ, and an insert-only
    table's IDs, offset by `cycle * changes`) and touch the same keys of an upsert table."""
    kind = BenchTable.without_rows(index).kind
    rng = random.Random(f"{seed}-{index}" + (f"-{cycle}" if cycle else ""))
    offset = cycle * changes
    rows = (
        _event_rows(rng, changes, hour, offset)
        if kind == "insert_only"
        else _upsert_rows(rng, changes, offset)
    )
    # File order is not sequence order: the latest change must win by SEQ, not by position.
    rng.shuffle(rows)
    return BenchTable(index, kind, tuple(rows))


def _upsert_rows(rng: random.Random, changes: int, offset: int = 0) -> list[dict[str, Any]]:
    """Inserts, updates (some move to another REGION), deletes (half key-only), re-inserts;
    sequence numbers from `offset + 1`."""
    keys = max(1, changes * 2 // 3)  # about half of the keys change more than once
    alive: set[int] = set()
    rows = []
    for seq in range(offset + 1, offset + changes + 1):
        key = rng.randrange(keys) + 1
        flag = "I" if key not in alive else "D" if rng.random() < 0.2 else "U"
        if flag == "D":
            alive.discard(key)
        else:
            alive.add(key)
        if flag == "D" and rng.random() < 0.5:
            rows.append({"FLAG": "D", "ID": key, "SEQ": seq})  # key-only delete
            continue
        rows.append(
            {
                "FLAG": flag,
                "ID": key,
                "NAME": f"name-{key}-{seq}",
                "QTY": rng.randrange(1000),
                "REGION": rng.choice(REGIONS),
                "SEQ": seq,
            }
        )
    return rows


def _event_rows(
    rng: random.Random, changes: int, hour: datetime, offset: int = 0
) -> list[dict[str, Any]]:
    """Insert-only events within the hour, about 5% of them sent twice (exact duplicates); IDs
    and sequence numbers from `offset + 1`."""
    duplicates = changes // 20
    rows = []
    for number in range(1, changes - duplicates + 1):
        second = (number * 3599) // max(1, changes)
        key = offset + number
        rows.append(
            {
                "FLAG": "I",
                "ID": key,
                "NAME": f"event-{key}",
                "QTY": rng.randrange(1000),
                "TS": hour + timedelta(seconds=second),
                "SEQ": key,
            }
        )
    rows += [dict(rng.choice(rows)) for _ in range(duplicates)]
    return rows


def expected_rows(table: BenchTable) -> list[tuple[Any, ...]]:
    """The final rows, computed here from the change set: latest per key by SEQ, deletes removed.

    Insert-only: each (ID, SEQ) once. Rows are tuples in `final_columns` order, sorted.
    """
    if table.kind == "insert_only":
        events = {(r["ID"], r["SEQ"]): r for r in table.rows}
        return sorted(
            (r["ID"], r["NAME"], r["QTY"], naive_utc(r["TS"]), r["SEQ"], r["TS"].date())
            for r in events.values()
        )
    latest: dict[int, dict[str, Any]] = {}
    for row in table.rows:
        if row["ID"] not in latest or row["SEQ"] > latest[row["ID"]]["SEQ"]:
            latest[row["ID"]] = row
    result = []
    for row in latest.values():
        if row["FLAG"] == "D":
            continue
        values: tuple[Any, ...] = (row["ID"], row["NAME"], row["QTY"], row["REGION"], row["SEQ"])
        if table.kind == "partitioned":
            values += (row["REGION"].upper(),)
        result.append(values)
    return sorted(result)


def naive_utc(value: Any) -> Any:
    """Timestamps as naive UTC, so files, Delta and expectations compare equal."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def write_landing(table: BenchTable, landing: Path, hour: datetime, *, part: int = 0) -> Path:
    """Write the change set as one file of the table's format into the hour's landing folder:
    `part-<part>` (the first part starts the table's landing folder afresh; a later cycle's
    part lands beside the files already there)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = landing / table.name / HourBatch(hour).folder
    if part == 0:
        shutil.rmtree(landing / table.name, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"part-{part:05d}.{table.file_format}"
    columns = ["FLAG", *(EVENT_COLUMNS if table.kind == "insert_only" else UPSERT_COLUMNS)]
    if table.file_format == "parquet":
        types = {"FLAG": pa.string(), "ID": pa.int64(), "NAME": pa.string(), "QTY": pa.int32()}
        types |= {"REGION": pa.string(), "SEQ": pa.int64()}
        schema = pa.schema([(c, types[c]) for c in columns])
        data = {c: [r.get(c) for r in table.rows] for c in columns}
        pq.write_table(pa.Table.from_pydict(data, schema=schema), path)
    elif table.file_format == "json":
        with path.open("w") as out:
            for row in table.rows:  # a key-only delete omits the other columns
                out.write(json.dumps(row) + "\n")
    else:
        with path.open("w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=columns)
            writer.writeheader()
            for row in table.rows:
                writer.writerow({**row, "TS": row["TS"].strftime("%Y-%m-%d %H:%M:%S")})
    return path


def final_rows(table: BenchTable, warehouse: Path) -> list[tuple[Any, ...]]:
    """The final Delta table's rows (delta-rs), as sorted tuples in `final_columns` order."""
    from deltalake import DeltaTable

    data = DeltaTable(str(warehouse / table.name / "final")).to_pyarrow_table(
        columns=table.final_columns
    )
    return sorted(tuple(naive_utc(row[c]) for c in table.final_columns) for row in data.to_pylist())


def check_table(table: BenchTable, warehouse: Path) -> str | None:
    """None when the final table equals the expectation exactly, else one line saying how not."""
    expected = expected_rows(table)
    try:
        actual = final_rows(table, warehouse)
    except Exception as error:  # no final table: the run failed before its first commit
        return f"{table.name}: final table unreadable: {type(error).__name__}: {error}"
    if actual == expected:
        return None
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    return (
        f"{table.name}: {len(actual)} rows, expected {len(expected)}; "
        f"missing {len(missing)} (first {missing[:1]}), unexpected {len(extra)} (first {extra[:1]})"
    )


# ---------------------------------------------------------------- measurement helpers


def load_now() -> dict[str, Any]:
    """The machine's load (shared with other engineers): `uptime` and the load averages."""
    text = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    one, five, fifteen = os.getloadavg()
    return {"uptime": text, "load1": one, "load5": five, "load15": fifteen, "cpus": os.cpu_count()}


def task_log(logs: Path, task: TaskRow) -> Path:
    """Where Airflow wrote a task instance's log (one JSON object a line)."""
    return (
        logs
        / f"dag_id={task.dag_id}"
        / f"run_id={task.run_id}"
        / f"task_id={task.task_id}"
        / f"attempt={max(task.try_number, 1)}.log"
    )


def execute_seconds(log: Path) -> float | None:
    """Seconds the operator's execute() took: end of "Pre Execute" to its "CDC summary" line.

    The steps report no timing of their own, so this is the closest to the step's own time the
    log gives (in spark-submit mode it includes the JVM start). None for a task with no summary
    (a skipped maintenance task) or no log.
    """
    begin = end = None
    try:
        lines = log.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        event = str(entry.get("event", ""))
        if begin is None and event == "::endgroup::":
            begin = datetime.fromisoformat(entry["timestamp"])
        elif event.startswith("CDC summary:"):
            end = datetime.fromisoformat(entry["timestamp"])
    if begin is None or end is None:
        return None
    return (end - begin).total_seconds()


def summarize_tasks(
    tasks: list[TaskRow], executes: dict[tuple[str, str], float] | None = None
) -> dict[str, dict[str, Any]]:
    """Per task id: count, states, wall-time median/mean/max, median wait in the queue, and with
    `executes` ((dag_id, task_id) -> execute() seconds) the median execute time and overhead."""
    executes = executes or {}
    summary: dict[str, dict[str, Any]] = {}
    for task_id in sorted({t.task_id for t in tasks}, key=_task_order):
        rows = [t for t in tasks if t.task_id == task_id]
        seconds = [s for s in (t.seconds for t in rows) if s is not None]
        inside = [executes[t.dag_id, t.task_id] for t in rows if (t.dag_id, t.task_id) in executes]
        overhead = [
            t.seconds - executes[t.dag_id, t.task_id]
            for t in rows
            if t.seconds is not None and (t.dag_id, t.task_id) in executes
        ]
        waits = [(t.start - t.queued).total_seconds() for t in rows if t.start and t.queued]
        states: dict[str, int] = {}
        for t in rows:
            states[t.state or "none"] = states.get(t.state or "none", 0) + 1
        summary[task_id] = {
            "count": len(rows),
            "states": states,
            "median_s": _round(statistics.median(seconds)) if seconds else None,
            "mean_s": _round(statistics.fmean(seconds)) if seconds else None,
            "max_s": _round(max(seconds)) if seconds else None,
            "queue_wait_median_s": _round(statistics.median(waits)) if waits else None,
            "execute_median_s": _round(statistics.median(inside)) if inside else None,
            "outside_execute_median_s": _round(statistics.median(overhead)) if overhead else None,
        }
    return summary


def _task_order(task_id: str) -> int:
    return TASK_IDS.index(task_id) if task_id in TASK_IDS else len(TASK_IDS)


def _round(value: float) -> float:
    return round(value, 2)


def cycle_figures(
    tasks: list[TaskRow], runs: list[RunRow], tables: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Cycle wall time (first task start to last task end), per table-run, per-run times, Gantt."""
    timed = [t for t in tasks if t.start is not None and t.end is not None]
    if not timed:
        raise BenchCycleError("no task of the cycle has a start and end time")
    first = min(t.start for t in timed if t.start)
    last = max(t.end for t in timed if t.end)
    cycle = (last - first).total_seconds()
    run_seconds = [(r.end - r.start).total_seconds() for r in runs if r.start and r.end]
    figures = {
        "cycle_seconds": _round(cycle),
        "per_table_run_seconds": _round(cycle / tables),
        "run_seconds_median": _round(statistics.median(run_seconds)) if run_seconds else None,
        "run_seconds_max": _round(max(run_seconds)) if run_seconds else None,
        "first_task_start": first.isoformat(),
        "last_task_end": last.isoformat(),
    }
    gantt = [
        {
            "dag_id": t.dag_id,
            "task_id": t.task_id,
            "state": t.state,
            "start_s": _round((t.start - first).total_seconds()) if t.start else None,
            "end_s": _round((t.end - first).total_seconds()) if t.end else None,
        }
        for t in sorted(timed, key=lambda t: (t.dag_id, _task_order(t.task_id)))
    ]
    return figures, gantt


# ---------------------------------------------------------------- Airflow and Spark per mode


@dataclass
class BenchAirflow(LocalAirflow):
    """LocalAirflow with the bench's task processes and a REST client for (un)pausing."""

    parallelism: int | None = None
    # The Kafka tables' connection (id, bootstrap servers), set as AIRFLOW_CONN_<ID>.
    kafka: tuple[str, str] | None = None

    def environment(self) -> dict[str, str]:
        env = super().environment()
        if self.kafka is not None:
            conn_id, servers = self.kafka
            extra = {"bootstrap.servers": servers}
            env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(
                {"conn_type": "kafka", "extra": extra}
            )
            env.pop("CDC_KAFKA_BOOTSTRAP_SERVERS", None)  # the connection's, not this shell's
        if self.parallelism is not None:  # task processes, each with a task queued behind it
            env["AIRFLOW__CDC__TASK_PROCESSES"] = str(self.parallelism)
            env["AIRFLOW__CORE__PARALLELISM"] = str(2 * self.parallelism)
        return env

    @property
    def launcher_parallelism(self) -> int:
        """The task processes the services run at once."""
        return int(self.environment()["AIRFLOW__CDC__TASK_PROCESSES"])

    def set_paused(self, prefix: str, count: int, *, paused: bool) -> int:
        """Pause or unpause every DAG whose id starts with `prefix` (bulk PATCH, 100 a page);
        how many DAGs the API says it matched."""
        matched = 0
        for offset in range(0, count, 100):
            query = urllib.parse.urlencode(
                {
                    # dag_id_prefix_pattern matched nothing in a PATCH here (Airflow 3.3.2);
                    # the substring pattern does (the home holds only the bench's DAGs).
                    "dag_id_pattern": prefix,
                    "update_mask": "is_paused",
                    "limit": 100,
                    "offset": offset,
                }
            )
            answer = self.rest("PATCH", f"/dags?{query}", {"is_paused": paused})
            matched += len(answer.get("dags", []))
        return matched

    def pause(self, dag_id: str) -> None:
        self.rest("PATCH", f"/dags/{dag_id}?update_mask=is_paused", {"is_paused": True})


def wait_for_dags(local: LocalAirflow, dag_ids: list[str], timeout: float = 300) -> datetime:
    """Wait until every DAG is serialized with a next run; that run's logical date (all equal)."""
    dates = {d for d in local.wait_for_dags(dag_ids, timeout, with_next_run=True).values() if d}
    if len(dates) != 1:
        raise BenchCycleError(f"the DAGs' next runs differ: {sorted(dates)}")
    return dates.pop()


def wait_clear_of_hour_boundary(margin: float = 120, every: int = 60) -> None:
    """Sleep past the next interval boundary (every `every` minutes from the full hour) when it
    is less than `margin` seconds away.

    The cycle's interval is the latest complete one: if it ended between reading it and the
    scheduler creating the runs, the runs would cover an interval without data.
    """
    now = datetime.now(UTC)
    start = now.replace(minute=now.minute - now.minute % every, second=0, microsecond=0)
    boundary = start + timedelta(minutes=every)
    if (boundary - now).total_seconds() < margin:
        pause = (boundary - now).total_seconds() + 15
        print(f"bench-cycle: waiting {pause:.0f} s for the interval to turn", flush=True)
        time.sleep(pause)


def warm_server(
    url: str, config: Path, tables: list[BenchTable], hour: datetime, folder: Path
) -> float:
    """Stage and overwrite-final every table once through the Connect server at `url`, on its
    own copy of the landing and warehouse folders; the seconds it took.

    A server that serves every run is warm from its earlier cycles, while a fresh JVM spends
    its first hundred or so steps compiling Spark's code: the measured cycle is a later cycle's.
    """
    from cdc_pipeline.config import load_table_configs
    from cdc_pipeline.intervals import Interval
    from cdc_pipeline.paths import TablePaths
    from spark_jobs.overwrite_final import run_overwrite_final
    from spark_jobs.runtime.context import StepContext
    from spark_jobs.runtime.session import build_connect_session
    from spark_jobs.stage import run_stage

    started = time.monotonic()
    configs = load_table_configs(config).tables
    interval = Interval(hour, hour + timedelta(hours=1))
    landing, warehouse = folder / "landing", folder / "warehouse"
    for table in tables:
        write_landing(table, landing, hour)
        paths = TablePaths(table.name, landing, warehouse)
        for step in (run_stage, run_overwrite_final):
            spark = build_connect_session(url, f"bench-warm-up-{table.name}")
            try:
                step(StepContext(spark, configs[table.name], paths), interval)
            finally:
                spark.stop()
        if (problem := check_table(table, warehouse)) is not None:
            raise BenchCycleError(f"warm-up: {problem}")
    shutil.rmtree(folder, ignore_errors=True)
    return time.monotonic() - started


def warm_up(
    spec: CycleSpec, mode: Mode, local: BenchAirflow, hour: datetime, folder: Path
) -> float | None:
    """Connect mode with `spec.warm`: warm the launcher's server (`warm_server`) on other change
    sets of the same tables, landed as files whatever the cycle's source (the steps after
    staging are the same code; a Kafka table's read is not warmed); its seconds, or None when
    the cycle runs on a cold server."""
    if mode != "connect" or not spec.warms_up:
        return None
    print(f"bench-cycle [{mode}]: warming the Connect server", flush=True)
    tables = [generate_table(i, spec.changes, hour, spec.seed + 1) for i in range(spec.tables)]
    if local.connect_server is None:
        raise BenchCycleError(
            "bench-cycle: connect mode, but the launcher started no Connect server"
        )
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "tables.yaml"
    config.write_text(
        yaml.safe_dump({"tables": [t.config_row(CONN_ID, spec.schedule) for t in tables]})
    )
    return warm_server(local.connect_server.url, config, tables, hour, folder)


SERVER_WARM_UP_TIMEOUT = 180.0
NO_WARM_UP_LINE = "none in the server's log"  # not (yet) done nor failed


def wait_for_server_warm_up(local: BenchAirflow, timeout: float) -> None:
    """Until the launcher's Connect server logs its warm-up's end (done or failed), at most
    `timeout` seconds; not at all for a server that does not warm up."""
    server = local.connect_server
    if server is None or not warms_up(server.master, server.conf):
        return
    deadline = time.monotonic() + timeout
    while server_warm_up(local).get("server_warm_up") == NO_WARM_UP_LINE:
        if time.monotonic() > deadline:
            print(f"bench-cycle: no end of the server's warm-up within {timeout:.0f} s", flush=True)
            return
        time.sleep(0.5)


def server_warm_up(local: BenchAirflow) -> dict[str, Any]:
    """The launcher's Connect server's own warm-up (`cdc_airflow.local.warm_up`), from its log:
    its seconds and when it finished (compare cycle 1's first task), or why there is none."""
    server = local.connect_server
    if server is None:
        return {}
    lines = server.log_path.read_text(errors="replace").splitlines()
    found = [line for line in lines if line.startswith("cdc warm-up: ")]
    done = re.fullmatch(r"cdc warm-up: done in ([0-9.]+) s, at (\S+)", found[0]) if found else None
    if done is None:
        return {"server_warm_up": found[0] if found else NO_WARM_UP_LINE}
    return {
        "server_warm_up": "done",
        "server_warm_up_seconds": float(done[1]),
        "server_warm_up_done_at": done[2],
    }


def cycle_tasks(
    local: BenchAirflow, db: MetadataDB, dag_ids: list[str], runs: list[RunRow]
) -> tuple[list[TaskRow], dict[tuple[str, str], float]]:
    """The task instances of `runs`, and each one's execute seconds read from its log."""
    tasks = [t for t in db.task_instances(dag_ids) if t.run_id in {r.run_id for r in runs}]
    executes = {
        (t.dag_id, t.task_id): seconds
        for t in tasks
        if (seconds := execute_seconds(task_log(local.home / "logs", t))) is not None
    }
    return tasks, executes


def run_label(mode: Mode, source: Source) -> str:
    """How the output and the report name a run: the mode, `kafka <mode>` for Kafka tables."""
    return mode if source == "files" else f"kafka {mode}"


def write_config(
    spec: CycleSpec, source: Source, tables: list[BenchTable], config: Path, run: str
) -> None:
    """The run's config table: every table reading files, or its own topic of run `run`."""
    if source == "files":
        rows = [t.config_row(CONN_ID, spec.schedule) for t in tables]
    else:
        rows = [
            t.kafka_config_row(CONN_ID, spec.schedule, t.topic(run), spec.kafka_conn_id)
            for t in tables
        ]
    config.write_text(yaml.safe_dump({"tables": rows}))


def feed(
    tables: list[BenchTable],
    landing: Path,
    hour: datetime,
    broker: KafkaBroker | None,
    run: str,
    *,
    part: int = 0,
) -> None:
    """Land each change set as file `part` in the hour's folder, or (a broker) send it to the
    table's topic of run `run`."""
    for table in tables:
        if broker is None:
            write_landing(table, landing, hour, part=part)
        else:
            broker.produce(table.topic(run), table.messages())


def make_topics(broker: KafkaBroker, tables: list[BenchTable], run: str, partitions: int) -> None:
    """Each table's topic of run `run`, with `partitions` partitions."""
    for table in tables:
        broker.create_topic(table.topic(run), partitions)


def kafka_broker_of(source: Source, broker: KafkaBroker | None) -> KafkaBroker | None:
    """The broker a run of `source` feeds (None: files); a Kafka run needs one."""
    if source == "files":
        return None
    if broker is None:
        raise BenchCycleError("bench-cycle: Kafka tables, but no broker was started")
    return broker


def prepare(
    spec: CycleSpec, mode: Mode, source: Source, workdir: Path, broker: KafkaBroker | None
) -> tuple[BenchAirflow, list[BenchTable]]:
    """A new `workdir` with the run's config table (and topics), and its Airflow (not started);
    the tables without their rows (those depend on the hour the scheduler will run)."""
    run = f"{source}-{mode}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    names = [BenchTable.without_rows(i) for i in range(spec.tables)]
    write_config(spec, source, names, workdir / "tables.yaml", run)
    if broker is not None:
        make_topics(broker, names, run, spec.kafka_partitions)
    local = BenchAirflow(
        workdir / "airflow_home",
        workdir / "tables.yaml",
        workdir / "landing",
        workdir / "warehouse",
        # None: LocalAirflow starts a Spark Connect server (a child: its RSS is counted).
        spark_connection=None if mode == "connect" else LOCAL_SPARK,
        log_dir=workdir / "logs",
        parallelism=spec.parallelism,
        kafka=(spec.kafka_conn_id, broker.bootstrap_servers) if broker else None,
    )
    return local, names


def run_mode(
    spec: CycleSpec,
    mode: Mode,
    workdir: Path,
    source: Source = "files",
    broker: KafkaBroker | None = None,
) -> dict[str, Any]:
    """`spec.cycles` consecutive scheduled cycles of `spec.tables` tables in `mode` reading
    `source` (kafka: from `broker`) on one Airflow and server; their figures and checks (the
    top-level figures: the one cycle, or the median of the cycles after the first)."""
    label, run = run_label(mode, source), f"{source}-{mode}"
    workdir = workdir.resolve()  # Airflow's home and SQLite URL need absolute paths
    load_before = load_now()
    setup_started = time.monotonic()
    broker = kafka_broker_of(source, broker)
    excluded = frozenset({broker.pid} if broker and broker.pid else ())
    with ProcessSampler(exclude=excluded) as rss:
        local, names = prepare(spec, mode, source, workdir, broker)
        dag_ids = [t.dag_id for t in names]
        # The warm-up pass (about 2 s a table) comes between reading the hour and unpausing.
        warm_margin = 3.0 * spec.tables if mode == "connect" and spec.warms_up else 0.0
        wait_clear_of_hour_boundary(120 + warm_margin, every=spec.every)
        print(f"bench-cycle [{label}]: starting Airflow on {local.url}", flush=True)
        local.migrate()
        try:
            local.start_services()
            local.airflow("dags", "reserialize")
            cycles = CycleRun(
                spec, mode, local, dag_ids, wait_for_dags(local, dag_ids), broker, run, rss
            )
            results = [cycles.measure(n, setup_started=setup_started) for n in range(spec.cycles)]
            other_runs = cycles.other_runs()
            cycles.setup |= server_warm_up(local)
        finally:
            local.stop()
    return {
        "mode": mode,
        "source": source,
        "label": label,
        "tables": spec.tables,
        "changes_per_table": spec.changes,
        "parallelism": local.launcher_parallelism,
        **steady_figures(results),
        **cycles.setup,
        "other_runs": len(other_runs),
        "execute_time_source": "task logs: end of Pre Execute to the 'CDC summary' line "
        "(the steps report no timing); outside_execute = task wall time minus that",
        "peak_rss_mib": round(rss.peak_mib),
        "peak_rss_top": rss.peak_top,
        "load_before": load_before,
        "load_after": load_now(),
        "tables_checked": spec.tables,
    }


@dataclass
class CycleRun:
    """The consecutive cycles of one mode and source on one Airflow: what each needs."""

    spec: CycleSpec
    mode: Mode
    local: BenchAirflow
    dag_ids: list[str]
    hour: datetime  # the first cycle's interval start
    broker: KafkaBroker | None
    run_name: str  # "<source>-<mode>": its topics' middle part
    processes: ProcessSampler  # each cycle's CPU per role, from first task start to last end
    # Every change fed so far per table index: each cycle checks final against all of them.
    changes: dict[int, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    setup: dict[str, Any] = field(default_factory=dict)

    @property
    def db(self) -> MetadataDB:
        return MetadataDB(self.local.home / "airflow.db")

    @property
    def label(self) -> str:
        return run_label(self.mode, "files" if self.broker is None else "kafka")

    def start_of(self, cycle: int) -> datetime:
        return self.hour + cycle * self.spec.period

    def measure(self, cycle: int, *, setup_started: float) -> dict[str, Any]:
        """Cycle `cycle` (0 first): its change sets fed for its interval (the first also warms
        up when asked and unpauses every DAG), its runs awaited, timed, and checked against
        every change fed so far."""
        spec, start = self.spec, self.start_of(cycle)
        tables = [
            generate_table(i, spec.changes, start, spec.seed, cycle=cycle)
            for i in range(spec.tables)
        ]
        feed(tables, Path(str(self.local.landing)), start, self.broker, self.run_name, part=cycle)
        fed_at = datetime.now(UTC)
        for table in tables:
            self.changes[table.index] = self.changes.get(table.index, ()) + table.rows
        if cycle == 0:
            self.first_cycle_set_up(setup_started)
        else:
            print(
                f"bench-cycle [{self.label}]: cycle {cycle + 1} of {spec.cycles}: change sets "
                f"fed for [{start.isoformat()}, +{spec.every}m); waiting for the scheduler",
                flush=True,
            )
        runs = self.wait_for_runs(cycle)
        tasks, executes = cycle_tasks(self.local, self.db, self.dag_ids, runs)
        figures, gantt = cycle_figures(tasks, runs, spec.tables)
        checked = [BenchTable(t.index, t.kind, self.changes[t.index]) for t in tables]
        warehouse = Path(str(self.local.warehouse))
        found = {t.dag_id: check_table(t, warehouse) for t in checked}
        early = started_before(tasks, fed_at)
        problems = [p for d, p in found.items() if p and d not in early]
        if early:
            problems.insert(0, early_problem(early, fed_at))
        window = (figures["first_task_start"], figures["last_task_end"])
        cpu = self.processes.cpu_between(*(datetime.fromisoformat(t).timestamp() for t in window))
        print(f"bench-cycle [{self.label}]: {cycle_line(cycle, figures, cpu)}", flush=True)
        return {
            "cycle": cycle + 1,
            "interval_start": start.isoformat(),
            **figures,
            "cpu": cpu,
            "runs_succeeded": sum(1 for r in runs if r.state == "success"),
            "runs_failed": sorted(r.dag_id for r in runs if r.state != "success"),
            "tables_exact": sum(1 for p in found.values() if p is None),
            "check_problems": problems,
            "tasks": summarize_tasks(tasks, executes),
            "gantt": gantt,
            "kinds": {k: sum(1 for t in tables if t.kind == k) for k in KINDS},
        }

    def first_cycle_set_up(self, setup_started: float) -> None:
        """Before the first cycle: the warm-up pass when asked, then every DAG unpaused."""
        spec = self.spec
        warm = warm_up(spec, self.mode, self.local, self.hour, self.local.home.parent / "warm-up")
        if spec.await_server_warm_up and self.local.connect_server is not None:
            waited = time.monotonic()
            wait_for_server_warm_up(self.local, SERVER_WARM_UP_TIMEOUT)
            self.setup["server_warm_up_awaited_seconds"] = _round(time.monotonic() - waited)
        self.setup["setup_seconds"] = _round(time.monotonic() - setup_started)
        self.setup["server"] = "cold" if warm is None else "warm"
        self.setup["warm_up_seconds"] = None if warm is None else _round(warm)
        print(
            f"bench-cycle [{self.label}]: {spec.tables} tables x {spec.changes} changes "
            f"{'sent to their topics' if self.broker else 'landed in the hour folder'} of "
            f"[{self.hour.isoformat()}, +{spec.every}m); unpausing every DAG",
            flush=True,
        )
        unpause_all(self.local, self.db, self.dag_ids)

    def wait_for_runs(self, cycle: int) -> list[RunRow]:
        """Cycle `cycle`'s run of every DAG, once each has finished."""
        start = self.start_of(cycle)
        return wait_for_dag_runs(
            self.db,
            self.dag_ids,
            1,
            select=lambda found: found.interval_start == start,
            label=f"bench-cycle [{self.label}] cycle {cycle + 1}",
            timeout=self.spec.timeout + self.spec.period.total_seconds(),
            every=self.spec.progress_every,
            on_poll=hour_guard(
                self.local,
                self.db,
                self.dag_ids,
                start,
                every=self.spec.every,
                earlier=[self.start_of(k) for k in range(cycle)],
                last=cycle == self.spec.cycles - 1,
            ),
        )

    def other_runs(self) -> list[RunRow]:
        """Runs of intervals no cycle measured (a next run started under the last cycle)."""
        measured = {self.start_of(k) for k in range(self.spec.cycles)}
        return [r for r in self.db.runs(self.dag_ids) if r.interval_start not in measured]


def started_before(tasks: list[TaskRow], fed_at: datetime) -> list[str]:
    """The DAGs whose run of the cycle started staging before the cycle's change sets were fed."""
    return sorted(
        {t.dag_id for t in tasks if t.task_id == "stage" and t.start and t.start < fed_at}
    )


def early_problem(dag_ids: list[str], fed_at: datetime) -> str:
    """What a cycle whose runs began before its changes landed measured: not the steady state."""
    return (
        f"{len(dag_ids)} tables' runs (first {dag_ids[0]}) started before this cycle's change "
        f"sets were fed at {fed_at.isoformat(timespec='seconds')}: the previous cycle and its "
        "check ran past this cycle's interval, so these runs could not see them (not a wrong "
        "result: the next run applies them, as later cycles' checks show) and the cycle "
        "measured runs with little or nothing to do; rerun with a longer --every"
    )


def cycle_line(cycle: int, figures: dict[str, Any], cpu: dict[str, Any] | None) -> str:
    """A cycle's time and where its CPU went, for the progress output."""
    line = f"cycle {cycle + 1}: {figures['cycle_seconds']} s"
    if cpu is None:
        return line
    roles = ", ".join(f"{role} {seconds}" for role, seconds in cpu["cpu_seconds"].items())
    return (
        f"{line}; CPU-s {roles} (machine {cpu['machine_cpu_seconds']}, "
        f"{cpu['cores_busy']} cores busy, {cpu.get('machine_steal_seconds', 0.0)} stolen)"
    )


STEADY_KEYS = ("cycle_seconds", "per_table_run_seconds", "run_seconds_median", "run_seconds_max")


def steady_figures(cycles: list[dict[str, Any]]) -> dict[str, Any]:
    """The mode's figures from its cycles: one cycle's own; with more, the median of the cycles
    after the first (the scheduler's steady state), the first cycle's apart, every cycle
    listed; the tasks and Gantt of the last cycle; the checks of all."""
    first, last = cycles[0], cycles[-1]
    later = cycles[1:] or cycles
    steady = {}
    for key in STEADY_KEYS:
        values = [c[key] for c in later if c[key] is not None]
        steady[key] = _round(statistics.median(values)) if values else None
    return {
        "kinds": first["kinds"],
        "interval_start": first["interval_start"],
        **steady,
        "first_task_start": last["first_task_start"],
        "last_task_end": last["last_task_end"],
        "cycles": len(cycles),
        "first_cycle_seconds": first["cycle_seconds"],
        "later_cycle_seconds": [c["cycle_seconds"] for c in cycles[1:]],
        "figures_from": "the one cycle"
        if len(cycles) == 1
        else f"median of cycles 2-{len(cycles)} (cycle 1: the first after the server started)",
        "runs_succeeded": sum(c["runs_succeeded"] for c in cycles),
        "runs_failed": sorted({d for c in cycles for d in c["runs_failed"]}),
        "tasks": last["tasks"],
        "tables_exact": min(c["tables_exact"] for c in cycles),
        "check_problems": [
            f"cycle {c['cycle']}: {p}" if len(cycles) > 1 else p
            for c in cycles
            for p in c["check_problems"]
        ],
        "per_cycle": [{k: v for k, v in c.items() if k not in ("gantt", "kinds")} for c in cycles],
        "gantt": last["gantt"],
    }


def unpause_all(local: BenchAirflow, db: MetadataDB, dag_ids: list[str]) -> None:
    """Unpause every DAG at once (one bulk PATCH), then one by one any the DB still shows paused."""
    matched = local.set_paused(DAG_PREFIX, len(dag_ids), paused=False)
    still: list[str] = []
    for _attempt in range(2):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            still = sorted(d for d, paused in db.paused(dag_ids).items() if paused)
            if not still:
                return
            time.sleep(1)
        print(
            f"bench-cycle: {len(still)} DAG(s) still paused (bulk PATCH matched {matched}); "
            "unpausing them one by one",
            flush=True,
        )
        for dag_id in still:
            local.rest("PATCH", f"/dags/{dag_id}?update_mask=is_paused", {"is_paused": False})
    raise BenchCycleError(f"still paused after the unpause: {', '.join(still)}")


def hour_guard(
    local: BenchAirflow,
    db: MetadataDB,
    dag_ids: list[str],
    hour: datetime,
    *,
    every: int = 60,
    lead: float = 45.0,
    earlier: Collection[datetime] = (),
    last: bool = True,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Callable[[list[RunRow]], None]:
    """A poll hook: fail when the scheduler ran another interval than `hour` (or the `earlier`
    cycles' intervals); in the `last` cycle, from `lead` seconds before the next interval's run
    is due, pause each DAG whose cycle run finished, so that the next run does not start under
    the cycle (a DAG still running then may get one: `other_runs` counts them). An earlier
    cycle lets the next run come: it is the next cycle, and it must not start before this one
    ended (else that cycle would start before its changes land).

    Nothing is paused earlier: a cycle that ends before then needs no pause, and a pause PATCH
    while tasks run can stall the local launcher's SQLite metadata DB for its 60 s busy timeout.
    """
    paused: set[str] = set()
    next_due = hour + 2 * timedelta(minutes=every)
    known = {hour, *earlier}

    def guard(runs: list[RunRow]) -> None:
        have = {r.dag_id for r in runs}
        others = [
            r for r in db.runs(dag_ids) if r.interval_start not in known and r.dag_id not in have
        ]
        if others:
            late = others[0].interval_start is not None and others[0].interval_start > hour
            raise BenchCycleError(
                f"{others[0].dag_id}: the scheduler ran [{others[0].interval_start}, +{every}m) "
                f"instead of [{hour.isoformat()}, +{every}m) "
                + (
                    "before this cycle ended: the cycle takes longer than the schedule's "
                    "period (fewer tables or --every 60)"
                    if late and not last
                    else "(the interval turned during set-up): run again"
                )
            )
        if not last or (next_due - now()).total_seconds() > lead:
            return
        for run in runs:
            if run.state in ("success", "failed") and run.dag_id not in paused:
                local.pause(run.dag_id)
                paused.add(run.dag_id)

    return guard


# ---------------------------------------------------------------- results


def plot_gantt(results: list[dict[str, Any]], path: Path) -> None:
    """One panel per mode: a bar per task instance (row = table), seconds from the cycle start."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "stage": "tab:blue",
        "overwrite_final": "tab:orange",
        "reset_staging": "tab:gray",
        "optimize": "tab:green",
        "vacuum": "tab:purple",
        "check": "tab:brown",
    }
    height = max(3.0, 0.12 * max(r["tables"] for r in results) + 1.5)
    figure, axes = plt.subplots(len(results), 1, figsize=(11, height * len(results)), squeeze=False)
    span = max(r["cycle_seconds"] for r in results)
    for axis, result in zip(axes[:, 0], results, strict=True):
        rows = sorted({g["dag_id"] for g in result["gantt"]})
        for bar in result["gantt"]:
            y = rows.index(bar["dag_id"])
            skipped = bar["state"] == "skipped"
            axis.barh(
                y,
                bar["end_s"] - bar["start_s"],
                left=bar["start_s"],
                height=0.3 if skipped else 0.8,
                color=colors.get(bar["task_id"], "black"),
                alpha=0.5 if skipped else 0.9,
            )
        axis.set_xlim(0, span * 1.02)
        axis.set_ylim(-1, len(rows))
        axis.set_yticks([])
        axis.set_ylabel(f"{len(rows)} tables")
        load = result["load_before"]["load1"]
        axis.set_title(
            f"{_label(result)}: {result['tables']} tables x {result['changes_per_table']} changes, "
            f"cycle {result['cycle_seconds']:.0f} s ({result['per_table_run_seconds']:.1f} s per "
            f"table-run), parallelism {result['parallelism']}, peak RSS "
            f"{result['peak_rss_mib']} MiB, load {load:.1f} before",
            fontsize=9,
        )
    axes[-1, 0].set_xlabel("seconds from the first task's start")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    figure.legend(handles, list(colors), loc="lower center", fontsize=8, ncol=len(colors))
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def connect_mode_available() -> bool:
    """Whether the local launcher can run the tasks as clients of its own Connect server."""
    return hasattr(LocalAirflow, "start_spark")


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_bench_cycle(spec: CycleSpec) -> dict[str, Any]:
    """Every mode of `spec` on the same tables; writes latest.json and latest.png in `output`."""
    spec.validate()
    if "connect" in spec.modes and not connect_mode_available():
        raise BenchCycleError(
            "connect mode: the DAGs do not run spark_connect connections yet; use --mode spark-submit"
        )
    spec.output.mkdir(parents=True, exist_ok=True)
    if threading.current_thread() is threading.main_thread():
        # A plain `kill` then unwinds through the `finally` blocks that stop Airflow and Spark.
        signal.signal(signal.SIGTERM, _raise_interrupt)
    started = datetime.now(UTC)
    results: list[dict[str, Any]] = []
    document: dict[str, Any] = {}
    broker = None
    try:
        if "kafka" in spec.sources:
            broker = start_kafka(spec.output / "work" / "kafka-broker")
        for mode in spec.modes:
            for source in spec.sources:  # a mode's sources one after the other: same load
                workdir = spec.output / "work" / (mode if source == "files" else f"kafka-{mode}")
                results.append(run_mode(spec, mode, workdir, source, broker))
                _print_result(results[-1])
                # Written after every run: a long bench stopped in its second run keeps the first.
                document = write_results(spec, started, results)
    finally:
        if broker is not None:
            broker.stop()
    print(f"bench-cycle: results in {spec.output}/latest.json and latest.png", flush=True)
    return document


def start_kafka(root: Path) -> KafkaBroker:
    """The bench's one Kafka broker (KRaft, .tools/kafka) on free ports, under `root`."""
    from cdc_tools.kafka_broker import available

    if (reason := available()) is not None:
        raise BenchCycleError(f"--source kafka: the Kafka broker cannot run: {reason}")
    shutil.rmtree(root, ignore_errors=True)
    broker = start_broker(root)
    print(
        f"bench-cycle: Kafka broker (pid {broker.pid}) on {broker.bootstrap_servers}, "
        f"started in {broker.started_in:.1f} s",
        flush=True,
    )
    return broker


def write_results(
    spec: CycleSpec, started: datetime, results: list[dict[str, Any]]
) -> dict[str, Any]:
    """latest.json (with the speedup when both modes ran) and latest.png in `spec.output`."""
    document: dict[str, Any] = {
        "benchmark": "cdc bench-cycle",
        "started_at": started.isoformat(),
        "spec": {**asdict(spec), "output": str(spec.output)},
        "modes": results,
    }
    document |= speedups(results)
    if comparison := kafka_vs_files(results):
        document["kafka_vs_files"] = comparison
    for key, value in speedups(results).items():
        print(f"bench-cycle: {key}: Connect is {value}x faster per table-run")
    for mode, pair in comparison.items():
        print(
            f"bench-cycle [{mode}]: cycle of {spec.tables} tables: files "
            f"{pair['files_cycle_seconds']} s, kafka {pair['kafka_cycle_seconds']} s "
            f"(kafka/files {pair['kafka_over_files_cycle']}); kafka within files' time: "
            f"{pair['kafka_within_files_time']}",
            flush=True,
        )
    (spec.output / "latest.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    plot_gantt(results, spec.output / "latest.png")
    return document


def speedups(results: list[dict[str, Any]]) -> dict[str, float]:
    """spark-submit over Connect seconds per table-run, per source that ran in both modes:
    `speedup_per_table_run` (files, the key of the bench before Kafka tables) and
    `speedup_per_table_run_kafka`."""
    found = {}
    for source in ("files", "kafka"):
        by_mode = {r["mode"]: r for r in results if r.get("source", "files") == source}
        if {"connect", "spark-submit"} <= by_mode.keys():
            key = "speedup_per_table_run" + ("" if source == "files" else "_kafka")
            found[key] = _round(
                by_mode["spark-submit"]["per_table_run_seconds"]
                / by_mode["connect"]["per_table_run_seconds"]
            )
    return found


def kafka_vs_files(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode where both sources ran: both cycles' figures side by side, kafka over files,
    and whether the Kafka tables' cycle took no longer than the file tables' (issue 54)."""
    comparison = {}
    for mode in dict.fromkeys(r["mode"] for r in results):
        pair = {r.get("source", "files"): r for r in results if r["mode"] == mode}
        if {"files", "kafka"} <= pair.keys():
            files, kafka = pair["files"], pair["kafka"]
            comparison[mode] = {
                "tables": files["tables"],
                "files_cycle_seconds": files["cycle_seconds"],
                "kafka_cycle_seconds": kafka["cycle_seconds"],
                "files_per_table_run_seconds": files["per_table_run_seconds"],
                "kafka_per_table_run_seconds": kafka["per_table_run_seconds"],
                "kafka_over_files_cycle": _round(kafka["cycle_seconds"] / files["cycle_seconds"]),
                "kafka_within_files_time": kafka["cycle_seconds"] <= files["cycle_seconds"],
                "both_exact": files["tables_exact"] == files["tables_checked"]
                and kafka["tables_exact"] == kafka["tables_checked"],
            }
    return comparison


def _print_result(result: dict[str, Any]) -> None:
    tasks = ", ".join(
        f"{task} {v['median_s']} s" for task, v in result["tasks"].items() if v["median_s"]
    )
    print(
        f"bench-cycle [{_label(result)}]: {result['tables']} tables, cycle "
        f"{result['cycle_seconds']} s = {result['per_table_run_seconds']} s per table-run; "
        f"median task wall times: {tasks}; peak RSS {result['peak_rss_mib']} MiB; "
        f"{result['tables_exact']}/{result['tables_checked']} tables exact; "
        f"load before: {result['load_before']['uptime']}",
        flush=True,
    )
    for problem in result["check_problems"][:10]:
        print(f"bench-cycle [{_label(result)}]: MISMATCH {problem}", flush=True)


def _label(result: dict[str, Any]) -> str:
    return str(result.get("label", result["mode"]))


def failed(document: dict[str, Any]) -> list[str]:
    """One line per failed run or inexact table over every mode (empty: the cycle passed)."""
    lines = []
    for result in document["modes"]:
        lines += [f"{_label(result)}: run of {d} failed" for d in result["runs_failed"]]
        lines += [f"{_label(result)}: {p}" for p in result["check_problems"]]
    return lines


__all__ = [
    "BenchCycleError",
    "BenchTable",
    "CycleSpec",
    "check_table",
    "expected_rows",
    "generate_table",
    "kafka_vs_files",
    "run_bench_cycle",
    "write_landing",
]
