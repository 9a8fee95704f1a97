"""`cdc demo`: sample change sets for the sample tables, applied hour by hour, with a summary."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from cdc_pipeline.config import ConfigLoadResult, TableConfig, project_root
from cdc_pipeline.errors import ConfigError
from cdc_pipeline.intervals import HourBatch, Interval, format_timestamp, parse_timestamp
from cdc_pipeline.paths import TablePaths, local_folder
from cdc_tools.generator import ChangeSpec, generate_events, generate_orders
from spark_jobs import delta
from spark_jobs.optimize import run_optimize
from spark_jobs.overwrite_final import run_overwrite_final
from spark_jobs.runtime.context import StepContext
from spark_jobs.stage import run_stage

if TYPE_CHECKING:  # Airflow is imported only when the demo runs through it
    from cdc_airflow.local.launcher import LocalAirflow
    from cdc_airflow.local.runs import RunRow

DEMO_TABLES = ("orders", "customers", "events", "customers_cdc", "accounts")
# Tables whose demo changes are the hand-written sample files under samples/<change_format>/.
SAMPLE_FILE_TABLES = ("customers_cdc", "accounts")

# Seed 000's story: Alice and Bob, then Alice becomes Angela, Bob is deleted (key only) and
# id2 comes back as Carol. Sequence SEQ orders the changes.
CUSTOMER_HOURS = [
    [
        {"FLAG": "I", "ID": "id1", "NAME": "Alice", "SEQ": 0},
        {"FLAG": "I", "ID": "id2", "NAME": "Bob", "SEQ": 0},
    ],
    [
        {"FLAG": "U", "ID": "id1", "NAME": "Angela", "SEQ": 1},
        {"FLAG": "D", "ID": "id2", "SEQ": 2},
        {"FLAG": "I", "ID": "id2", "NAME": "Carol", "SEQ": 3},
    ],
]


def write_customers(landing_dir: Path, start: datetime) -> int:
    """Seed 000's customer changes as JSON lines, one hour folder per step of the story."""
    for hour, rows in enumerate(CUSTOMER_HOURS):
        folder = landing_dir / HourBatch(start + timedelta(hours=hour)).folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "changes.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(CUSTOMER_HOURS)


def copy_sample_files(table: TableConfig, landing_dir: Path, start: datetime, hours: int) -> int:
    """Copy samples/<change_format>/<table>/hour-NN.json into the hour folders from `start`."""
    copied = 0
    for source in sorted(
        (project_root() / "samples" / table.change_format / table.name).glob("hour-*.json")
    ):
        offset = int(source.stem.split("-")[1])
        if offset >= hours:
            continue
        folder = landing_dir / HourBatch(start + timedelta(hours=offset)).folder
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, folder / f"{table.name}-{offset:02d}.json")
        copied += 1
    return copied


def generate_demo_data(
    spark, configs: ConfigLoadResult, start: datetime, hours: int, keys: int
) -> None:  # type: ignore[no-untyped-def]
    """Write the sample change sets of the three sample tables into the landing zone."""
    missing = [name for name in DEMO_TABLES if name not in configs.tables]
    if missing:
        raise ConfigError(
            f"the demo needs the sample tables {', '.join(missing)} in the config table"
        )
    for name in DEMO_TABLES:
        table = configs.tables[name]
        # The demo writes its sample files with local file calls: a local landing folder.
        landing = local_folder(TablePaths.for_table(name).landing, "CDC_LANDING")
        if name == "orders":
            spec = ChangeSpec(keys=keys, duplicate_pct=2, late_pct=5)
            generate_orders(spark, spec, landing, start, hours, table.file_format)
        elif name == "customers":
            write_customers(landing, start)
        elif name in SAMPLE_FILE_TABLES:
            copy_sample_files(table, landing, start, hours)
        else:
            generate_events(
                spark,
                landing,
                start,
                hours,
                per_hour=max(10, keys // 10),
                file_format=table.file_format,
            )


def table_summary(name: str, start: datetime, hours: int, extra: str) -> str:
    """One line on a table's Delta tables after the demo."""
    paths = TablePaths.for_table(name)
    final = delta.load_snapshot(paths.final)
    ledger = delta.arrow_table_rows(paths.ledger, ["rows_staged", "rows_quarantined"])
    staged = sum(int(r["rows_staged"]) for r in ledger)
    quarantined = sum(int(r["rows_quarantined"]) for r in ledger)
    window = f"[{format_timestamp(start)}, {format_timestamp(start + timedelta(hours=hours))})"
    history = delta.load_snapshot(paths.history)
    if history.exists:
        extra += f" history_versions={history.num_records}"
    return (
        f"demo {name} {window}: {extra} staged={staged} quarantined={quarantined} "
        f"final_rows={final.num_records} partitions={len(final.partition_values()) or 1} files={len(final.files)} "
        f"final_version={final.version} staging_version={delta.load_snapshot(paths.staging).version} "
        f"final={paths.final}"
    )


def run_demo(spark, configs: ConfigLoadResult, start: datetime, hours: int, keys: int) -> list[str]:  # type: ignore[no-untyped-def]
    """Without Airflow: generate, then stage and apply hour by hour in this process."""
    generate_demo_data(spark, configs, start, hours, keys)
    lines = []
    for name in DEMO_TABLES:
        table = configs.tables[name]
        context = StepContext(spark, table, TablePaths.for_table(name))
        for hour in range(hours):
            interval = Interval(start + timedelta(hours=hour), start + timedelta(hours=hour + 1))
            run_stage(context, interval)
            run_overwrite_final(context, interval)
        run_optimize(context)
        lines.append(table_summary(name, start, hours, f"runs={hours}"))
    return lines


def queue_backfill(
    local: LocalAirflow,
    dag_id: str,
    first: datetime,
    last: datetime,
    max_active_runs: int = 2,
    *,
    reprocess: Literal["none", "failed", "completed"] = "completed",
) -> dict[str, Any]:
    """Unpause a DAG and queue a backfill of its runs from `first` to `last` through the REST
    API (no Airflow CLI process per call); the backfill as the API returns it. `reprocess`:
    which runs of those dates already there run again (by default all: the demo's home keeps
    the runs of the demos before, and a rerun applies its hours again, as the first did).

    A backfill of the same dates not completed yet answers the POST with 409: one this POST made
    before its answer was lost (a timeout, a server error after the commit), one a demo stopped
    half-way left, or one whose scheduler stopped before marking it completed. With `reprocess`
    completed it is cancelled (its queued runs fail) and the backfill queued again, so every
    hour runs again as the new one's; otherwise it is returned. A running backfill of other
    dates is a RuntimeError naming it and the fix."""
    local.rest("PATCH", f"/dags/{dag_id}?update_mask=is_paused", {"is_paused": False})
    body = {
        "dag_id": dag_id,
        "from_date": first.isoformat(),
        "to_date": last.isoformat(),
        "max_active_runs": max_active_runs,
        "reprocess_behavior": reprocess,
    }
    try:
        return dict(local.rest("POST", "/backfills", body))
    except urllib.error.HTTPError as error:
        if error.code != 409:
            raise
        running = [
            b
            for b in local.rest("GET", f"/backfills?dag_id={dag_id}")["backfills"]
            if b["completed_at"] is None
        ]
        if not running:
            raise
        backfill = running[0]
        dates = (parse_timestamp(backfill["from_date"]), parse_timestamp(backfill["to_date"]))
        if dates != (first, last):
            raise RuntimeError(
                f"{dag_id} has a backfill running from {backfill['from_date']} to "
                f"{backfill['to_date']} (id {backfill['id']}): let it finish or cancel it in the "
                "Airflow UI (`make airflow`, the DAG's page), then run the demo again"
            ) from error
        if reprocess != "completed":
            return dict(backfill)
        local.rest("PUT", f"/backfills/{backfill['id']}/cancel")
        return dict(local.rest("POST", "/backfills", body))


def runs_summary(runs: list[RunRow], dag_id: str) -> str:
    mine = [r for r in runs if r.dag_id == dag_id]
    return f"runs={len(mine)} succeeded={sum(1 for r in mine if r.state == 'success')}"


def wait_for_demo_runs(home: Path, dag_ids: list[str], start: datetime, hours: int) -> list[RunRow]:
    """Wait for each DAG's runs of the demo's hours to finish, printing progress every 10 s.

    Chosen by their interval: every run of those hours, whether the backfill made it, ran it
    again (an earlier demo's, reprocessed) or found it going on (then not its own)."""
    from cdc_airflow.local.runs import MetadataDB, wait_for_dag_runs

    end = start + timedelta(hours=hours)
    return wait_for_dag_runs(
        MetadataDB(home / "airflow.db"),
        dag_ids,
        hours,
        select=lambda run: run.interval_start is not None and start <= run.interval_start < end,
        label="demo",
        timeout=1800,
        per_table=True,
    )


def run_airflow_demo(
    configs: ConfigLoadResult, config_path: Path, start: datetime, hours: int, keys: int
) -> list[str]:
    """Through Airflow: generate, then a scheduler-run backfill of every sample table's DAG.

    In the home `make airflow` uses (`default_home`), so the runs show there afterwards; held
    for the demo's time (`claim_home`: a `make airflow` running on it is a HomeInUseError, one
    line naming it, before anything starts). What can overlap does: the Connect server's JVM
    starts while Airflow migrates its DB, and the change sets are generated while the Airflow
    services start."""
    from cdc_airflow.local.home import claim_home, default_home
    from cdc_airflow.local.launcher import LocalAirflow, spark_connection_from_environment
    from cdc_pipeline.paths import landing_root, warehouse_root
    from spark_jobs.runtime.session import build_connect_session, spark_remote

    began = time.monotonic()

    def say(message: str) -> None:
        print(f"demo: [{time.monotonic() - began:5.1f} s] {message}", flush=True)

    with claim_home(default_home(), by="cdc demo") as home:
        local = LocalAirflow(home, config_path.resolve(), landing_root(), warehouse_root())
        remote = spark_remote()
        if remote:  # an existing Connect server (CDC_SPARK_REMOTE) instead of a local one
            local.spark_connection = spark_connection_from_environment()
        try:
            local.start_spark(wait=False)
            say(f"starting Airflow in {home} (dag-processor, api-server on {local.url})")
            local.migrate()
            local.start_services(wait=False, scheduler=False)  # the scheduler once runs are queued
            # One Spark for the whole demo: the Connect server generates the data and then
            # serves every task; this process holds no JVM of its own.
            local.wait_for_spark()
            url = remote or local.connect_server.url  # type: ignore[union-attr]
            say(f"Spark Connect server {url}; generating the change sets")
            spark = build_connect_session(url, "cdc-demo-data")
            try:
                generate_demo_data(spark, configs, start, hours, keys)
            finally:
                spark.stop()
            dag_ids = [configs.tables[name].dag_id for name in DEMO_TABLES]
            local.wait_for_api()
            local.wait_for_dags(dag_ids)
            for dag_id in dag_ids:
                queue_backfill(local, dag_id, start, start + timedelta(hours=hours - 1))
            local.start("scheduler")
            say(f"backfills queued: {len(dag_ids)} DAGs x {hours} hourly runs; scheduler started")
            runs = wait_for_demo_runs(local.home, dag_ids, start, hours)
            say(f"every run finished; `make airflow` shows them (its home is {home})")
            return [
                table_summary(name, start, hours, runs_summary(runs, configs.tables[name].dag_id))
                for name in DEMO_TABLES
            ]
        finally:
            local.stop()
