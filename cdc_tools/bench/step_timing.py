"""Time `stage` and `overwrite-final` alone at the bench's shape, for before/after comparisons.

    python -m cdc_tools.bench.step_timing --rows 5000000 --touched 5 --repeats 5
    python -m cdc_tools.bench.step_timing --rows 5000000 --touched 1 --repeats 10 --call-sites paired

Builds the bench's final table once, then per run lands a fresh change set (the bench's: 85%
updates, 5% partition moves, 5% inserts, 5% key-only deletes in `--touched` partitions), copies
the table, stages and applies it; the first two runs (of each variant) warm the JVM and are not
counted. Prints one JSON line: the medians and every counted run, and how many requests each
step sent to Spark (py4j calls, or Connect RPCs under CDC_SPARK_REMOTE): a figure the machine's
load does not move. Run it from two checkouts (`git worktree`) one after the other to compare
code on the same machine; `--call-sites paired` compares PySpark's call-site capture on and off
in one JVM, runs alternating.
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
def driver_round_trips(*, connect: bool) -> Iterator[list[int]]:
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
    parser = argparse.ArgumentParser(prog="python -m cdc_tools.bench.step_timing")
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--touched", type=int, default=1, help="partitions touched (of 100)")
    parser.add_argument("--changes", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--call-sites",
        choices=["off", "on", "paired"],
        default="off",
        help="PySpark's per-column call-site capture (off in the steps' sessions); paired: "
        "runs alternate on/off in the same JVM, a median each",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("CDC_SPARK_UI", "false")

    from cdc_tools.bench import merges as bench
    from spark_jobs.runtime.session import build_spark_session, is_connect

    spark = build_spark_session("cdc-step-timing")
    load_before = [round(x, 2) for x in os.getloadavg()]
    variants = {"off": ["off"], "on": ["on"], "paired": ["on", "off"]}[args.call_sites]
    # on, off, off, on, ...: neither variant always runs second (the JVM warms as it goes).
    order = [v for i in range(args.repeats) for v in (variants if i % 2 == 0 else variants[::-1])]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="cdc-step-timing-") as tmp:
        work = Path(tmp)
        spec = bench.BenchSpec(rows=args.rows, changes=args.changes, output=work, repeats=1)
        base, _ = bench.build_base(spark, spec, work, args.rows)
        for n, variant in enumerate(variants * WARM_UP_RUNS + order):
            capture_call_sites(on=variant == "on")
            run = one_run(spark, spec, base, work / f"run-{n}", args.touched)
            if n >= WARM_UP_RUNS * len(variants):
                runs[variant].append(run)
    summary = {v: summarised(r) for v, r in runs.items()}
    result: dict[str, Any] = {
        "rows": args.rows,
        "touched": args.touched,
        "load_before": load_before,
        "mode": "connect" if is_connect(spark) else "classic",
    }
    if len(summary) == 1:
        result.update(summary[variants[0]])
    else:
        result["call_sites"] = summary
    print(json.dumps(result))
    return 0


def capture_call_sites(*, on: bool) -> None:
    """Turn PySpark's per-column call-site capture on or off in this process. PySpark reads its
    static setting once and keeps it in a module global: setting that global is how the same
    JVM runs both ways."""
    from pyspark.errors import utils

    utils._enable_debugging_cache = on  # type: ignore[assignment]


def summarised(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians and every run's seconds; the last run's request counts and step counts (they
    do not depend on the load; the requests vary by a few percent from run to run)."""
    stage_runs = [r["stage"] for r in runs]
    overwrite_runs = [r["overwrite"] for r in runs]
    last = runs[-1]
    return {
        "stage_median": statistics.median(stage_runs),
        "overwrite_median": statistics.median(overwrite_runs),
        "stage": stage_runs,
        "overwrite": overwrite_runs,
        "stage_round_trips": last["stage_round_trips"],
        "overwrite_round_trips": last["overwrite_round_trips"],
        "counts": last["counts"],
    }


def one_run(spark: Any, spec: Any, base: Path, case: Path, touched: int) -> dict[str, Any]:
    """Land a fresh change set, copy the base table, stage and apply it; times and requests."""
    from cdc_pipeline.intervals import Interval
    from cdc_pipeline.paths import TablePaths
    from cdc_tools.bench import merges as bench
    from spark_jobs.overwrite_final import run_overwrite_final
    from spark_jobs.runtime.context import StepContext
    from spark_jobs.runtime.session import is_connect
    from spark_jobs.stage import run_stage

    connect = is_connect(spark)
    window = Interval(bench.CHANGE_HOUR, bench.CHANGE_HOUR.replace(hour=1))
    landing = case / "landing"
    bench.land_changes(spark, spec, landing, spec.rows, touched)
    shutil.copytree(base, case / "own" / bench.TABLE / "final")
    table = bench.bench_table(spec)
    context = StepContext(spark, table, TablePaths(bench.TABLE, landing, case / "own"))
    started = time.perf_counter()
    with driver_round_trips(connect=connect) as stage_calls:
        run_stage(context, window)
    staged = time.perf_counter() - started
    started = time.perf_counter()
    with driver_round_trips(connect=connect) as overwrite_calls:
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
