"""A local Connect server's warm-up: the steps' work done once on made-up tables at start.

A JVM starts cold: its first stage and overwrite-final runs interpret Spark's planner, Connect's
protocol and the Parquet and Delta code and compile them as they go. On 2 cores a fresh server's
first cycle of 65 tables spent about 40 CPU-s more than the next ones (100 against 56-61): the
JIT compilers' and the class loading's. The driver program (`connect_driver.py`) starts this
module in the background once the server serves, on local masters, unless the server's
`spark.cdc.warmUp` is `false`: two made-up tables, a partitioned Parquet one and a CSV one,
through stage and overwrite-final twice each (inserts, updates, partition moves, deletes,
key-only ones too), in a temporary folder removed afterwards. The tables' schedulers may send
steps meanwhile: they are served as usual, sharing the cores. A failed warm-up is reported in
the server's log and leaves the server serving.

`python -m cdc_airflow.local.warm_up sc://127.0.0.1:PORT` runs it against a running server.
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from cdc_pipeline.config import load_table_configs
from cdc_pipeline.intervals import HourBatch, Interval
from cdc_pipeline.paths import TablePaths

RUNS = 2  # per table: the first creates its tables, the second merges into them
START = datetime(2000, 1, 1, tzinfo=UTC)
KEYS = 200
# The catalog database the made-up final tables are registered in (overwrite-final registers
# them), dropped with them at the end: no name of a user's database is touched.
DATABASE = "cdc_warm_up"
COLUMNS = {"ID": "bigint", "NAME": "string", "QTY": "int", "REGION": "string", "SEQ": "bigint"}
TABLES = {
    "cdc_warm_up_parquet": {
        "file_format": "parquet",
        "partition_expression": "upper(REGION)",
        "partition_column": "REGION_UP",
    },
    "cdc_warm_up_csv": {"file_format": "csv"},
}


def config_rows() -> list[dict[str, Any]]:
    """The made-up tables' config rows (no maintenance: only stage and overwrite-final run)."""
    common = {
        "columns": COLUMNS,
        "keys": ["ID"],
        "database": DATABASE,
        "sequence_by": ["SEQ"],
        "flag_column": "FLAG",
        "schedule": "@hourly",
        "start_date": START.date().isoformat(),
        "optimize_schedule": None,
        "vacuum_schedule": None,
        "reset_staging_schedule": None,
        "check_schedule": None,
    }
    return [{"name": name, **common, **extra} for name, extra in TABLES.items()]


def changes(run: int) -> list[dict[str, Any]]:
    """Run `run`'s change set, a change per key at most: every key inserted in run 0; in a later
    run, a fifth of the keys deleted (half of them key-only), the fifth deleted the run before
    inserted again, and the other even keys updated, into another region."""
    regions = ("north", "south", "east", "west")
    rows: list[dict[str, Any]] = []
    for key in range(1, KEYS + 1):
        seq = run * KEYS + key
        if run and key % 5 == run % 5:
            deleted: dict[str, Any] = {"FLAG": "D", "ID": key, "SEQ": seq}
            if (key // 5) % 2:  # a key-only delete sends nothing else
                deleted |= {"NAME": f"gone-{key}", "QTY": 0, "REGION": regions[key % 4]}
            rows.append(deleted)
            continue
        again = run > 1 and key % 5 == (run - 1) % 5
        if run and not again and key % 2:
            continue
        flag = "U" if run and not again else "I"
        region = regions[(key + run) % 4]
        rows.append(
            {
                "FLAG": flag,
                "ID": key,
                "NAME": f"n{key}-{run}",
                "QTY": seq % 1000,
                "REGION": region,
                "SEQ": seq,
            }
        )
    return rows


def land(landing: Path, name: str, file_format: str, run: int) -> None:
    """Run `run`'s changes as one file in its hour's landing folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = landing / name / HourBatch(START + timedelta(hours=run)).folder
    folder.mkdir(parents=True, exist_ok=True)
    rows, columns = changes(run), ["FLAG", *COLUMNS]
    if file_format == "parquet":
        types = {"ID": pa.int64(), "QTY": pa.int32(), "SEQ": pa.int64()}
        schema = pa.schema([(c, types.get(c, pa.string())) for c in columns])
        data = {c: [row.get(c) for row in rows] for c in columns}
        pq.write_table(pa.Table.from_pydict(data, schema=schema), folder / "part-0.parquet")
        return
    with (folder / "part-0.csv").open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def expected_rows(runs: int) -> int:
    """Rows alive after `runs` runs of `changes`."""
    alive: set[int] = set()
    for run in range(runs):
        for row in changes(run):
            (alive.discard if row["FLAG"] == "D" else alive.add)(row["ID"])
    return len(alive)


def warm_up(url: str, work: Path, runs: int = RUNS) -> float:
    """Stage and overwrite-final each made-up table `runs` times at the server at `url`, their
    files in the empty folder `work`; the seconds taken. Raises when a final table does not
    hold the rows its changes leave."""
    from spark_jobs.overwrite_final import run_overwrite_final
    from spark_jobs.runtime.context import StepContext
    from spark_jobs.runtime.session import build_connect_session
    from spark_jobs.stage import run_stage

    started = time.monotonic()
    config_file = work / "tables.yaml"
    config_file.write_text(yaml.safe_dump({"tables": config_rows()}))
    configs = load_table_configs(config_file).tables
    try:
        for run in range(runs):
            hour = START + timedelta(hours=run)
            interval = Interval(hour, hour + timedelta(hours=1))
            for name, config in configs.items():
                land(work / "landing", name, config.file_format, run)
                paths = TablePaths(name, work / "landing", work / "warehouse")
                for step in (run_stage, run_overwrite_final):  # a session each, as in a DAG
                    spark = build_connect_session(url, f"cdc-warm-up-{step.__name__}")
                    try:
                        step(StepContext(spark, config, paths), interval)
                    finally:
                        spark.stop()
        spark = build_connect_session(url, "cdc-warm-up-check")
        try:
            for name in configs:
                final = str(TablePaths(name, work / "landing", work / "warehouse").final)
                found = spark.read.format("delta").load(final).count()
                if found != expected_rows(runs):
                    raise RuntimeError(f"{name}: {found} rows, {expected_rows(runs)} expected")
        finally:
            spark.stop()
    finally:
        with contextlib.suppress(Exception):  # a server gone: nothing left to unregister
            spark = build_connect_session(url, "cdc-warm-up-unregister")
            try:
                spark.sql(f"DROP DATABASE IF EXISTS `{DATABASE}` CASCADE")
            finally:
                spark.stop()
    return time.monotonic() - started


FOLDER_PREFIX = "cdc-warm-up-"


def remove_orphans() -> None:
    """Remove the folders of warm-ups killed outright (SIGKILL): those whose process is gone."""
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*-*"):
        pid = folder.name[len(FOLDER_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            continue  # alive, another user's


def main(argv: list[str] | None = None) -> int:
    """Warm up the server at argv[0]; report to stdout (the server's log). Exits 0 either way:
    a failed warm-up leaves a serving server."""
    url = (argv if argv is not None else sys.argv[1:])[0]
    remove_orphans()
    work = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
    outcome: list[float | BaseException] = []

    def run() -> None:
        try:
            outcome.append(warm_up(url, work))
        except BaseException as error:  # best effort: reported, and the server serves on
            outcome.append(error)

    def stop(signum: int, frame: object) -> None:
        shutil.rmtree(work, ignore_errors=True)
        os._exit(128 + signum)

    # Stopped with the server (SIGTERM, also when its JVM dies): the steps run in a thread, as
    # a call to a dead server can block the thread in gRPC where no Python handler runs.
    signal.signal(signal.SIGTERM, stop)
    worker = threading.Thread(target=run, name="warm-up", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.5)
    shutil.rmtree(work, ignore_errors=True)
    seconds = outcome[0]
    if isinstance(seconds, BaseException):
        print(f"cdc warm-up: failed, the server serves on cold: {seconds!r}", flush=True)
        return 0
    finished = datetime.now(UTC).isoformat(timespec="seconds")
    print(f"cdc warm-up: done in {seconds:.1f} s, at {finished}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
