"""Time `stage` and `overwrite-final` alone at the bench's shape, for before/after comparisons.

    python -m cdc_tools.step_timing --rows 5000000 --touched 5 --repeats 5

Builds the bench's final table once, then per run lands a fresh change set (the bench's: 85%
updates, 5% partition moves, 5% inserts, 5% key-only deletes in `--touched` partitions), copies
the table, stages and applies it; the first two runs warm the JVM and are not counted. Prints
one JSON line: the medians and every counted run, and how many requests each step sent to
Spark (py4j calls, or Connect RPCs under CDC_SPARK_REMOTE): a figure the machine's load does not
move. Run it from two checkouts (`git worktree`) one after the other to compare code on the
same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

WARM_UP_RUNS = 2


@contextmanager
def driver_round_trips(connect: bool) -> Iterator[list[int]]:
    """Count the requests this process sends to Spark inside the block: a classic session's
    py4j commands to its JVM, or a Connect client's RPCs (analyze, execute, config). The list
    holds the count when the block ends."""
    if connect:
        from pyspark.sql.connect.client.core import SparkConnectClient

        owner: Any = SparkConnectClient
        names = ["_analyze", "_execute", "_execute_and_fetch_as_iterator", "config"]
    else:
        from py4j.clientserver import ClientServerConnection

        owner, names = ClientServerConnection, ["send_command"]
    counted = [0]
    originals: dict[str, Callable[..., Any]] = {name: getattr(owner, name) for name in names}

    def counting(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            counted[0] += 1
            return original(*args, **kwargs)

        return call

    for name, original in originals.items():
        setattr(owner, name, counting(original))
    try:
        yield counted
    finally:
        for name, original in originals.items():
            setattr(owner, name, original)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_tools.step_timing")
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--touched", type=int, default=1, help="partitions touched (of 100)")
    parser.add_argument("--changes", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("CDC_SPARK_UI", "false")

    from cdc_tools import bench
    from spark_jobs.session import build_spark_session, is_connect

    spark = build_spark_session("cdc-step-timing")
    load_before = [round(x, 2) for x in os.getloadavg()]
    runs = []
    with tempfile.TemporaryDirectory(prefix="cdc-step-timing-") as tmp:
        work = Path(tmp)
        spec = bench.BenchSpec(rows=args.rows, changes=args.changes, output=work, repeats=1)
        base, _ = bench.build_base(spark, spec, work, args.rows)
        for run in range(args.repeats + WARM_UP_RUNS):
            runs.append(one_run(spark, spec, base, work / f"run-{run}", args.touched))
    counted = runs[WARM_UP_RUNS:]
    stage_runs = [r["stage"] for r in counted]
    overwrite_runs = [r["overwrite"] for r in counted]
    last = runs[-1]
    print(
        json.dumps(
            {
                "rows": args.rows,
                "touched": args.touched,
                "load_before": load_before,
                "stage_median": statistics.median(stage_runs),
                "overwrite_median": statistics.median(overwrite_runs),
                "stage": stage_runs,
                "overwrite": overwrite_runs,
                "mode": "connect" if is_connect(spark) else "classic",
                # The last run's (the same every run: the plan does not depend on the load).
                "stage_round_trips": last["stage_round_trips"],
                "overwrite_round_trips": last["overwrite_round_trips"],
                "counts": last["counts"],
            }
        )
    )
    return 0


def one_run(spark: Any, spec: Any, base: Path, case: Path, touched: int) -> dict[str, Any]:
    """Land a fresh change set, copy the base table, stage and apply it; times and requests."""
    from cdc_pipeline.intervals import Interval
    from cdc_pipeline.paths import TablePaths
    from cdc_tools import bench
    from spark_jobs.common import StepContext
    from spark_jobs.overwrite_final import run_overwrite_final
    from spark_jobs.session import is_connect
    from spark_jobs.stage import run_stage

    connect = is_connect(spark)
    window = Interval(bench.CHANGE_HOUR, bench.CHANGE_HOUR.replace(hour=1))
    landing = case / "landing"
    bench.land_changes(spark, spec, landing, spec.rows, touched)
    shutil.copytree(base, case / "own" / bench.TABLE / "final")
    table = bench.bench_table(spec)
    context = StepContext(spark, table, TablePaths(bench.TABLE, landing, case / "own"))
    started = time.perf_counter()
    with driver_round_trips(connect) as stage_calls:
        run_stage(context, window)
    staged = time.perf_counter() - started
    started = time.perf_counter()
    with driver_round_trips(connect) as overwrite_calls:
        report = run_overwrite_final(context, window)
    applied = time.perf_counter() - started
    shutil.rmtree(case)
    return {
        "stage": round(staged, 3),
        "overwrite": round(applied, 3),
        "stage_round_trips": stage_calls[0],
        "overwrite_round_trips": overwrite_calls[0],
        "counts": dict(report.counts),
    }


if __name__ == "__main__":
    raise SystemExit(main())
