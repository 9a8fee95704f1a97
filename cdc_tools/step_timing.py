"""Time `stage` and `overwrite-final` alone at the bench's shape, for before/after comparisons.

    python -m cdc_tools.step_timing --rows 5000000 --touched 5 --repeats 5

Builds the bench's final table once, then per run lands a fresh change set (the bench's: 85%
updates, 5% partition moves, 5% inserts, 5% key-only deletes in `--touched` partitions), copies
the table, stages and applies it; the first two runs warm the JVM and are not counted. Prints
one JSON line: the medians and every counted run. Run it from two checkouts (`git worktree`)
one after the other to compare code on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

WARM_UP_RUNS = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_tools.step_timing")
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--touched", type=int, default=1, help="partitions touched (of 100)")
    parser.add_argument("--changes", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("CDC_SPARK_UI", "false")

    from cdc_pipeline.intervals import Interval
    from cdc_pipeline.paths import TablePaths
    from cdc_tools import bench
    from spark_jobs.common import StepContext
    from spark_jobs.overwrite_final import run_overwrite_final
    from spark_jobs.session import build_spark_session
    from spark_jobs.stage import run_stage

    spark = build_spark_session("cdc-step-timing")
    load_before = [round(x, 2) for x in os.getloadavg()]
    stage_runs, overwrite_runs = [], []
    counts: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="cdc-step-timing-") as tmp:
        work = Path(tmp)
        spec = bench.BenchSpec(rows=args.rows, changes=args.changes, output=work, repeats=1)
        base, _ = bench.build_base(spark, spec, work, args.rows)
        table = bench.bench_table(spec)
        window = Interval(bench.CHANGE_HOUR, bench.CHANGE_HOUR.replace(hour=1))
        for run in range(args.repeats + WARM_UP_RUNS):
            case = work / f"run-{run}"
            landing = case / "landing"
            bench.land_changes(spark, spec, landing, args.rows, args.touched)
            shutil.copytree(base, case / "own" / bench.TABLE / "final")
            context = StepContext(spark, table, TablePaths(bench.TABLE, landing, case / "own"))
            started = time.perf_counter()
            run_stage(context, window)
            staged = time.perf_counter() - started
            started = time.perf_counter()
            report = run_overwrite_final(context, window)
            applied = time.perf_counter() - started
            if run >= WARM_UP_RUNS:
                stage_runs.append(round(staged, 3))
                overwrite_runs.append(round(applied, 3))
            counts = dict(report.counts)
            shutil.rmtree(case)
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
                "counts": counts,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
