"""benchmarks/results/README.md, generated from the result files: one line per result.

benchmarks/results/ holds the results the docs cite, as the tools wrote them: `cdc bench`'s
JSON, `cdc bench-cycle`'s and `python -m cdc_tools.bench.auto_cdc`'s, each named
`<date>-<kind>[-<what>].json` (the date the JSON records, else the day it was added), and a
plot as the same name's `.png`. The index lists them newest first with their kind, mode and
headline figures, read from the files; `tests/repo/test_benchmark_results.py` regenerates it
and fails when the committed index differs, so a result added without `--write` is caught.

    python -m cdc_tools.bench.results_index            # print the index
    python -m cdc_tools.bench.results_index --write    # replace benchmarks/results/README.md
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cdc_pipeline.paths import project_root

RESULTS = Path("benchmarks") / "results"
INDEX = RESULTS / "README.md"

# `cdc bench`'s methods, in the order the index names them.
METHODS = {
    "overwrite_final": "overwrite-final",
    "delta_rs_merge": "delta-rs MERGE",
    "delta_rs_merge_unstreamed": "delta-rs MERGE (unstreamed)",
    "delta_spark_merge": "delta-spark MERGE INTO",
    "delta_spark_merge_dv": "delta-spark MERGE INTO (deletion vectors)",
    "full_rebuild": "full rebuild",
}

HEADER = """\
# Benchmark results

<!-- Generated from the JSON files of this folder by cdc_tools/bench/results_index.py: do not edit.
     Add a result as below, then run `python -m cdc_tools.bench.results_index --write`. -->

Every result the docs cite, as the tool wrote it, newest first. The current figures and the
commands that regenerate them are on [Performance](../../docs/performance.md); what each run
measured, and why, is in the [performance log](../../docs/performance-log.md).

Adding a result: `cdc bench` writes `bench-results/latest.json` (and `latest.png`),
`cdc bench-cycle` `bench-results/cycle/latest.json` (and `latest.png`), and
`python -m cdc_tools.bench.auto_cdc` `bench-results/auto-cdc-cycle/latest.json`, and
`python -m cdc_tools.bench.long_run` the file given to `--output`. Copy the file
here as `<date>-<kind>[-<what>].json`, the date the JSON records (`created` or `started_at`;
the day of the run when it records none) and a word or two for what the run compared
(`2026-11-28-bench-connect-one-task-1.json`), its plot as the same name's `.png`, run
`python -m cdc_tools.bench.results_index --write` and link the file from the page that cites it.

Modes: `classic` is a Spark session in the bench's own process (`local[*]`), `connect` a client
of a Spark Connect server; a cycle's server is `warm` (it served the tables once before the
measured cycle) or `cold` (a fresh server). Seconds are medians where the tool repeats a run.

| date | result | kind | mode | headline figures |
|---|---|---|---|---|
"""


def recorded_date(result: dict[str, Any]) -> str | None:
    """The day the result records (`created` of `cdc bench`, `started_at` of `cdc bench-cycle`),
    as YYYY-MM-DD; None when it records none (`cdc_tools.bench.auto_cdc`'s own JSON)."""
    if "created" in result:  # 20261128T164746Z
        stamp = str(result["created"])
        return f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}"
    if "started_at" in result:  # 2026-11-28T15:41:25.794473+00:00 (bench-cycle, long_run)
        return str(result["started_at"])[:10]
    return None


def kind(result: dict[str, Any]) -> str:
    """Which tool wrote the result: bench, bench-cycle, auto-cdc or long-run."""
    if "cases" in result:
        return "bench"
    if result.get("benchmark") == "cdc bench-cycle":
        return "bench-cycle"
    if "incremental_run_seconds" in result:
        return "auto-cdc"
    if result.get("benchmark") == "cdc_tools.bench.long_run":
        return "long-run"
    raise ValueError(
        "not a result of cdc bench, cdc bench-cycle, cdc_tools.bench.auto_cdc or "
        "cdc_tools.bench.long_run"
    )


def seconds(value: float) -> str:
    """`0.60 s`, `128.1 s`: two decimals under 100 s, one above."""
    return f"{value:.2f} s" if value < 100 else f"{value:.1f} s"


def bench_mode(result: dict[str, Any]) -> str:
    """classic or connect: the bench records no driver JVM memory as a Connect client."""
    first = result["cases"][0]["methods"]["overwrite_final"]
    return "connect" if first.get("jvm_peak_mb") is None else "classic"


def bench_figures(result: dict[str, Any]) -> str:
    """Each table shape (rows, changes), then each touched fraction once (the size sweep's x1
    is the fraction case again) with every method's seconds."""
    shapes: dict[tuple[int, int], list[str]] = {}
    seen: set[tuple[int, int, float]] = set()
    for case in result["cases"]:
        shape = (case["rows"], case["changes"])
        if (*shape, case["touched_fraction"]) in seen:
            continue
        seen.add((*shape, case["touched_fraction"]))
        times = ", ".join(
            f"{label} {seconds(case['methods'][method]['seconds'])}"
            for method, label in METHODS.items()
            if method in case["methods"]
        )
        shapes.setdefault(shape, []).append(f"{case['touched_fraction'] * 100:g}%: {times}")
    parts = [
        f"{rows:,} rows, {changes:,} changes: " + "; ".join(fractions)
        for (rows, changes), fractions in shapes.items()
    ]
    if kafka := result.get("kafka_staging"):
        parts.append(
            f"Kafka: {kafka['messages']:,} messages staged in {seconds(kafka['stage_seconds'])}, "
            f"{kafka['messages_per_second']:,} messages/s"
        )
    return "; ".join(parts)


def tables(count: int, changes: int) -> str:
    """`65 tables x 300 changes`, `1 table x 20,000 changes`."""
    return f"{count} table{'s' if count != 1 else ''} x {changes:,} changes"


def cycle_mode(result: dict[str, Any]) -> str:
    """The modes, the server (warm or cold, when recorded) and a schedule other than hourly."""
    words = [", ".join(mode.get("label", mode["mode"]) for mode in result["modes"])]
    server = result["modes"][0].get("server")
    if server:
        words.append(f"{server} server")
    every = result["spec"].get("every")
    if every and every != 60:
        words.append(f"every {every} min")
    return ", ".join(words)


def cycle_figures(result: dict[str, Any]) -> str:
    """Per mode: tables, cycle time, per table-run, the steps' medians, tables exact; then the
    AUTO CDC side when the cycle ran it."""
    parts = []
    for mode in result["modes"]:
        tasks = mode["tasks"]
        # `label`: `kafka connect` for Kafka tables (bench-cycle --source), else the mode.
        named = f"{mode.get('label', mode['mode'])}: " if len(result["modes"]) > 1 else ""
        parts.append(
            f"{named}{tables(mode['tables'], mode['changes_per_table'])}, "
            f"cycle {seconds(mode['cycle_seconds'])} "
            f"({seconds(mode['per_table_run_seconds'])} per table-run; "
            f"stage {seconds(tasks['stage']['median_s'])}, "
            f"overwrite_final {seconds(tasks['overwrite_final']['median_s'])} median; "
            f"{mode['tables_exact']}/{mode['tables_checked']} exact)"
        )
    if "auto_cdc" in result:
        parts.append(f"AUTO CDC: {auto_cdc_figures(result['auto_cdc'])}")
    return "; ".join(parts)


def auto_cdc_figures(result: dict[str, Any]) -> str:
    """Tables, changes, the first and the incremental run, targets exact."""
    return (
        f"{tables(result['tables'], result['changes'])}, "
        f"first run {seconds(result['first_run_seconds'])}, "
        f"incremental run {seconds(result['incremental_run_seconds'])} "
        f"({result['exact_targets']}/{result['tables']} exact)"
    )


def long_run_figures(result: dict[str, Any]) -> str:
    """The table, the runs (a year in: the ledger's seeded versions), and the first and last
    block's step seconds and client CPU (and the no-op check's, when measured)."""
    blocks = [result["blocks"][0], result["blocks"][-1]]
    seeded = result.get("ledger_rows") or 0
    start = f" after {seeded:,} ledger versions" if seeded else ""
    return (
        f"{tables(1, result['changes'])}, {result['runs']} runs one after another{start}; "
        + "; ".join(
            f"runs {b['runs']}: stage {seconds(b['stage_wall'])} "
            f"(client {b['stage_client_cpu']:.3f} CPU-s), overwrite_final "
            f"{seconds(b['overwrite_final_wall'])} "
            f"(client {b['overwrite_final_client_cpu']:.3f} CPU-s)"
            + (
                f", no-op check client {b['has_work_client_cpu']:.3f} CPU-s"
                if "has_work_client_cpu" in b
                else ""
            )
            for b in blocks
        )
    )


def line(path: Path, result: dict[str, Any]) -> str:
    """The index's row of one result file."""
    found = kind(result)
    if found == "bench":
        mode, figures = bench_mode(result), bench_figures(result)
    elif found == "bench-cycle":
        mode, figures = cycle_mode(result), cycle_figures(result)
    elif found == "long-run":
        mode, figures = "connect", long_run_figures(result)
    else:
        mode, figures = "connect", auto_cdc_figures(result)
    link = f"[{path.name}]({path.name})"
    plot = path.with_suffix(".png")
    if plot.exists():
        link += f" ([plot]({plot.name}))"
    return f"| {path.name[:10]} | {link} | {found} | {mode} | {figures} |"


def render(folder: Path | None = None) -> str:
    """The index of every JSON in `folder` (benchmarks/results/), newest first."""
    folder = folder or project_root() / RESULTS
    rows = []
    for path in folder.glob("*.json"):
        result = json.loads(path.read_text())
        # 20261128T164746Z and 2026-11-28T16:47:46.1+00:00 alike: YYYYMMDDhhmmss.
        stamp = "".join(
            c for c in str(result.get("created") or result.get("started_at") or "") if c.isdigit()
        )[:14]
        rows.append((path.name[:10], stamp, path.name, line(path, result)))
    rows.sort(reverse=True)
    return HEADER + "".join(row[-1] + "\n" for row in rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the index, or with --write replace benchmarks/results/README.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write", action="store_true", help=f"write {INDEX} instead of printing it"
    )
    args = parser.parse_args(argv)
    page = render()
    if args.write:
        target = project_root() / INDEX
        target.write_text(page)
        print(f"wrote {target}")
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
