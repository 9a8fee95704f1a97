"""`cdc demo`: sample change sets for the sample tables, applied hour by hour, with a summary."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

from cdc_pipeline.config import ConfigLoadResult
from cdc_pipeline.errors import ConfigError
from cdc_pipeline.intervals import HourBatch, Interval, format_timestamp
from cdc_pipeline.paths import TablePaths
from spark_jobs import delta
from spark_jobs.common import StepContext
from spark_jobs.generator import ChangeSpec, generate_events, generate_orders
from spark_jobs.optimize import run_optimize
from spark_jobs.overwrite_final import run_overwrite_final
from spark_jobs.stage import run_stage

DEMO_TABLES = ("orders", "customers", "events")

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


def run_demo(spark, configs: ConfigLoadResult, start: datetime, hours: int, keys: int) -> list[str]:  # type: ignore[no-untyped-def]
    """Generate, stage and apply `hours` hours for each sample table; one summary line per table."""
    missing = [name for name in DEMO_TABLES if name not in configs.tables]
    if missing:
        raise ConfigError(
            f"the demo needs the sample tables {', '.join(missing)} in the config table"
        )
    lines = []
    for name in DEMO_TABLES:
        table = configs.tables[name]
        paths = TablePaths.for_table(name)
        if name == "orders":
            spec = ChangeSpec(keys=keys, duplicate_pct=2, late_pct=5)
            generate_orders(spark, spec, paths.landing, start, hours, table.file_format)
        elif name == "customers":
            write_customers(paths.landing, start)
        else:
            generate_events(
                spark,
                paths.landing,
                start,
                hours,
                per_hour=max(10, keys // 10),
                file_format=table.file_format,
            )
        context = StepContext(spark, table, paths)
        totals = {"staged": 0, "quarantined": 0, "rows_written": 0}
        for hour in range(hours):
            interval = Interval(start + timedelta(hours=hour), start + timedelta(hours=hour + 1))
            staged = run_stage(context, interval)
            applied = run_overwrite_final(context, interval)
            totals["staged"] += int(staged.counts["staged"])
            totals["quarantined"] += int(staged.counts["quarantined"])
            totals["rows_written"] += int(applied.counts.get("rows_written", 0))
        run_optimize(context)
        final = delta.load_snapshot(paths.final)
        lines.append(
            f"demo {name} [{format_timestamp(start)}, {format_timestamp(start + timedelta(hours=hours))}): "
            f"runs={hours} staged={totals['staged']} quarantined={totals['quarantined']} "
            f"final_rows={final.num_records} partitions={len(final.partition_values()) or 1} "
            f"files={len(final.files)} final_version={final.version} final={paths.final}"
        )
    return lines
