"""One table's runs one after another on one server: how a step's cost grows over a day.

    python -m cdc_tools.bench.long_run --runs 100
    python -m cdc_tools.bench.long_run --runs 100 --output benchmarks/results/long-run.json
    python -m cdc_tools.bench.long_run --runs 20 --ledger-rows 35040   # a year in

A table on a 15-minute schedule runs 96 times a day before its daily optimize: every run adds a
commit to the logs of its staging, final, ledger and applied tables, a file to the ledger and
applied, and an hour folder to staging. An 8-cycle `cdc bench-cycle` does not show what that
costs by evening; this does. It starts a Connect server with the launcher's settings (or uses
`--remote`), then for each consecutive hour lands `cdc bench-cycle`'s change set of one table
and runs `stage` and `overwrite_final` as tasks do (a new Connect session each), checking the
final table against every change landed so far after each run. It records each step's wall
seconds and this process's CPU seconds (the client's side: delta-rs log reads, the ledger,
planning) and the server's CPU per run, prints the means of every ten runs, and writes every
run to `--output` with the machine's load before.

The ledger and applied gain a row per file version for ever: `--ledger-rows N` starts the table
a year in (35,040 runs of `*/15`), its ledger and applied holding N applied versions of earlier
hours (four an hour) as one file each (as its optimize leaves them), their files in the landing
zone's hour folders. Each run also times the no-op check an Airflow task makes before its step
(`idle_outside`: the listing, the ledger, applied; client CPU only, once per run where tasks
make it twice).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from cdc_tools.bench.cycle import (
    CONN_ID,
    BenchTable,
    check_table,
    generate_table,
    load_now,
    write_landing,
)

BENCHMARK = "cdc_tools.bench.long_run"
START = datetime(2026, 11, 1, tzinfo=UTC)
BLOCK = 10  # runs per printed line


@dataclass(frozen=True)
class StepTimes:
    """One step of one run: wall seconds, this process's CPU seconds, the server's CPU seconds."""

    wall: float
    client_cpu: float
    server_cpu: float


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in process group `pgid` (the server's
    spark-submit and its JVM), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # Fields after the parenthesised command: state ppid pgrp ... utime(12) stime(13).
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def timed(step: Callable[[], Any], server_pgid: int | None) -> StepTimes:
    """Run `step`; its wall time, this process's CPU time and the server's CPU time."""
    server_before = group_cpu_seconds(server_pgid) if server_pgid else 0.0
    cpu_before, wall_before = time.process_time(), time.monotonic()
    step()
    wall, cpu = time.monotonic() - wall_before, time.process_time() - cpu_before
    server = group_cpu_seconds(server_pgid) - server_before if server_pgid else 0.0
    return StepTimes(round(wall, 3), round(cpu, 3), round(server, 2))


SEEDED_PER_HOUR = 4  # one file a run on `*/15`


def seed_year(paths: Any, versions: int, file_format: str) -> None:
    """`versions` staged and applied file versions, four an hour before START, in one file each of
    the ledger and applied (their staged rows long since reset), and their files in the landing
    zone, each hour folder's time before its last version was staged (a stage run never opens
    it again, as a real one that listed it)."""
    import pyarrow as pa

    from cdc_pipeline.intervals import HourBatch
    from spark_jobs import delta, landing
    from spark_jobs.overwrite import applied

    hours = -(-versions // SEEDED_PER_HOUR)
    rows = []
    for i in range(versions):
        hour = HourBatch(START - timedelta(hours=hours - i // SEEDED_PER_HOUR))
        landed = hour.start + timedelta(minutes=15 * (i % SEEDED_PER_HOUR) + 14)
        folder = Path(str(paths.landing)) / hour.folder
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"part-{i % SEEDED_PER_HOUR:05d}.{file_format}"
        path.write_text("seeded\n")
        os.utime(path, (landed.timestamp(), landed.timestamp()))
        os.utime(folder, (landed.timestamp(), landed.timestamp()))
        seen = path.stat()
        landed_file = landing.LandingFile(
            hour.batch_id,
            paths.landing / hour.folder / path.name,
            f"{hour.folder}/{path.name}",
            seen.st_size,
            seen.st_mtime_ns,
            sha256=f"{i:064x}",
        )
        rows.append(
            landing.ledger_row(
                landed_file,
                hour.batch_id,
                path.name,
                staged=300,
                quarantined=0,
                refused=None,
                now=landed + timedelta(minutes=1),
                run_id=f"seed-{i}",
                newest_change=landed,
            )
        )
    ledger = pa.Table.from_pylist(rows, landing.LEDGER_SCHEMA)
    delta.append_arrow(paths.ledger, ledger)
    entries = landing.read_ledger(ledger).entries()
    applied.mark_applied(paths, applied.Pending(tuple(entries.values())), "seed", 0)


def run_steps(
    url: str,
    server_pgid: int | None,
    table_index: int,
    runs: int,
    changes: int,
    work: Path,
    *,
    ledger_rows: int = 0,
) -> list[dict[str, Any]]:
    """`runs` consecutive hours of one table through stage and overwrite_final at `url` (whose
    process group is `server_pgid`, when known); every run's times. Raises when the final table
    differs from the changes landed so far."""
    from cdc_pipeline.config import load_table_configs
    from cdc_pipeline.intervals import Interval
    from cdc_pipeline.paths import TablePaths
    from spark_jobs.overwrite_final import run_overwrite_final
    from spark_jobs.runtime.context import StepContext
    from spark_jobs.runtime.session import build_connect_session
    from spark_jobs.stage import run_stage
    from spark_jobs.status.pending_work import idle_outside

    shape = BenchTable.without_rows(table_index)
    config_file = work / "tables.yaml"
    config_file.write_text(yaml.safe_dump({"tables": [shape.config_row(CONN_ID, "@hourly")]}))
    config = load_table_configs(config_file).tables[shape.name]
    landing, warehouse = work / "landing", work / "warehouse"
    paths = TablePaths(shape.name, landing, warehouse)
    landed: tuple[dict[str, Any], ...] = ()
    results = []
    for run in range(runs):
        hour = START + timedelta(hours=run)
        table = generate_table(table_index, changes, hour, seed=42, cycle=run)
        write_landing(table, landing, hour, part=run)  # the first run empties landing
        if run == 0 and ledger_rows:
            seed_year(paths, ledger_rows, config.file_format)
        landed += table.rows
        interval = Interval(hour, hour + timedelta(hours=1))
        check = partial(idle_outside, paths, config, interval, count_outside=False)
        times = {"has_work": timed(check, None)}
        for name, step in (("stage", run_stage), ("overwrite_final", run_overwrite_final)):
            spark = build_connect_session(url, f"long-run-{name}")
            try:
                context = StepContext(spark, config, paths)
                times[name] = timed(partial(step, context, interval), server_pgid)
            finally:
                spark.stop()
        problem = check_table(BenchTable(table_index, table.kind, landed), warehouse)
        if problem is not None:
            raise RuntimeError(f"run {run + 1}: {problem}")
        results.append({"run": run + 1, **{k: vars(v) for k, v in times.items()}})
    return results


def blocks(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Means of every BLOCK runs: per step its wall, client CPU and server CPU seconds."""
    out = []
    for first in range(0, len(results), BLOCK):
        part = results[first : first + BLOCK]
        row: dict[str, Any] = {"runs": f"{first + 1}-{first + len(part)}"}
        for step in ("stage", "overwrite_final"):
            for figure in ("wall", "client_cpu", "server_cpu"):
                row[f"{step}_{figure}"] = round(statistics.mean(r[step][figure] for r in part), 3)
        if all("has_work" in r for r in part):
            row["has_work_client_cpu"] = round(
                statistics.mean(r["has_work"]["client_cpu"] for r in part), 3
            )
        out.append(row)
    return out


def table_logs(work: Path, table_index: int) -> dict[str, dict[str, int]]:
    """Per Delta table of the run: its version, data files, and commits since its checkpoint."""
    from deltalake import DeltaTable

    folder = work / "warehouse" / BenchTable.without_rows(table_index).name
    out = {}
    for path in sorted(p for p in folder.iterdir() if (p / "_delta_log").is_dir()):
        table = DeltaTable(str(path))
        last = path / "_delta_log" / "_last_checkpoint"
        checkpoint = json.loads(last.read_text())["version"] if last.exists() else -1
        out[path.name] = {
            "version": table.version(),
            "files": len(table.file_uris()),
            "commits_since_checkpoint": table.version() - checkpoint,
        }
    return out


def print_blocks(summary: list[dict[str, Any]]) -> None:
    """One line per ten runs: each step's wall, client and server CPU (and the no-op check's)."""
    for row in summary:
        print(
            f"runs {row['runs']:>7}: stage {row['stage_wall']:.3f} s "
            f"(client {row['stage_client_cpu']:.3f}, server {row['stage_server_cpu']:.2f} CPU-s)"
            f" | overwrite_final {row['overwrite_final_wall']:.3f} s "
            f"(client {row['overwrite_final_client_cpu']:.3f}, "
            f"server {row['overwrite_final_server_cpu']:.2f} CPU-s)"
            + (
                f" | no-op check client {row['has_work_client_cpu']:.3f} CPU-s"
                if "has_work_client_cpu" in row
                else ""
            ),
            flush=True,
        )


def argument_parser() -> argparse.ArgumentParser:
    """The tool's options."""
    parser = argparse.ArgumentParser(prog="python -m cdc_tools.bench.long_run")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--changes", type=int, default=300, help="changes per run (300)")
    parser.add_argument(
        "--table", type=int, default=0, help="bench-cycle's table index (0: partitioned)"
    )
    parser.add_argument("--remote", help="a running Connect server (sc://host:port)")
    parser.add_argument(
        "--ledger-rows",
        type=int,
        default=0,
        help="start a year in: the ledger and applied hold this many earlier versions (0)",
    )
    parser.add_argument("--output", type=Path, help="write the figures here as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser()
    argv = list(argv) if argv is not None else sys.argv[1:]
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    started, load_before = datetime.now(UTC), load_now()
    server, url, server_pgid = None, args.remote, None
    if url is None:
        from cdc_airflow.local import connect_server

        server = connect_server.start(master="local[2]")
        url, server_pgid = server.url, os.getpgid(server.pid)
    work = Path(tempfile.mkdtemp(prefix="cdc-long-run-"))
    try:
        results = run_steps(
            url,
            server_pgid,
            args.table,
            args.runs,
            args.changes,
            work,
            ledger_rows=args.ledger_rows,
        )
        logs = table_logs(work, args.table)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary = blocks(results)
    print_blocks(summary)
    report = {
        "benchmark": BENCHMARK,
        "command": " ".join([f"python -m {BENCHMARK}", *argv]),
        "started_at": started.isoformat(timespec="seconds"),
        "load_before": load_before,
        "runs": args.runs,
        "changes": args.changes,
        "ledger_rows": args.ledger_rows,
        "table": BenchTable.without_rows(args.table).kind,
        "tables_exact_after_every_run": True,
        "blocks": summary,
        "logs_at_end": logs,
        "every_run": results,
    }
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
