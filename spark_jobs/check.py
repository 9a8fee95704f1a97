"""Step `check`: verify a table's invariants from its Delta tables and name the one that breaks.

Checked, reading only key, sequence, arrival and partition columns (and the log's file lists):

- final holds every key once (insert-only: every key and sequence once) and in one partition;
- no key is live in final while tombstones hold a later delete of it;
- history's current rows are final's rows (tables with history: true);
- every data file the current versions reference exists (every table of the table's folder);
- staging holds no change of a file final has applied (`applied` marks it) later than what final
  and tombstones hold for its key (a change lost by a run): the latest-change rule over those
  changes, final and tombstones gives final. Ranking is by (sequence_by, arrival), the order
  overwrite-final ranks by; after a reset-staging, staging is final plus tombstones, which holds
  trivially. A change of a file not applied yet is not a breach: it waits for the next
  overwrite-final (another run may have staged it a moment ago; `cdc status` shows what waits).

Every table's snapshot is loaded first (the applied marks, appended after final's commit, then
staging before tombstones before final, the order a run commits them, so a run landing in
between cannot make a consistent table look broken); when a breach is found and a version moved
meanwhile, the check is made again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import reduce
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_pipeline import summaries
from cdc_pipeline.columns import CHECK_FILE
from cdc_pipeline.config import TableConfig, load_table_configs
from cdc_pipeline.counts import CheckCounts, TableCheckCounts
from cdc_pipeline.errors import ConfigError
from cdc_pipeline.paths import Location, TablePaths
from spark_jobs import delta
from spark_jobs.overwrite.history import IS_CURRENT
from spark_jobs.rules.transforms import ARRIVAL, BATCH, FILE
from spark_jobs.runtime.args import add_check_arguments
from spark_jobs.runtime.failures import one_line
from spark_jobs.runtime.notices import show_warnings_on_stderr, warn
from spark_jobs.runtime.report import StepReport, write_summary
from spark_jobs.runtime.storage import store_for

# The tables of a table's folder (names of TablePaths properties), loaded in the order a run
# commits them: staging, then tombstones, then final, then history. A commit landing between
# two loads then only makes a later table newer: a change staged earlier looks applied, a delete
# newer in final than in tombstones breaks nothing checked. The applied marks are the exception,
# loaded before staging and final: a mark is appended after final's commit, so a file marked in
# the loaded marks has its changes in the final loaded later. History newer than final can look
# like a breach: a breach seen while a version moved is checked again (MAX_ROUNDS).
TABLES = (
    "ledger",
    "quarantine",
    "applied",
    "staging",
    "history_log",
    "tombstones",
    "final",
    "history",
)
# The order versions are shown in (the check line, `_cdc_check.json`): the tables users read first.
SHOWN = (
    "final",
    "staging",
    "tombstones",
    "history",
    "history_log",
    "quarantine",
    "ledger",
    "applied",
)
MAX_ROUNDS = 3  # a breach seen while versions moved is checked again, this often in all


@dataclass
class CheckResult:
    """The outcome of checking one table."""

    table: str
    breaches: list[str] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)
    counts: TableCheckCounts = field(default_factory=TableCheckCounts)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every invariant holds."""
        return not self.breaches

    def line(self) -> str:
        """`check orders: ok keys=... versions=final@12,...` or `check orders: BREACH ...`."""
        versions = ",".join(f"{name}@{v}" for name, v in self.versions.items())
        counts = " ".join(f"{k}={v}" for k, v in self.counts.as_dict().items())
        if self.ok:
            return f"check {self.table}: ok {counts} versions={versions or 'none'}".replace(
                "  ", " "
            )
        return f"check {self.table}: BREACH {'; '.join(self.breaches)}"

    def document(self) -> dict[str, Any]:
        """What `_cdc_check.json` holds (the CDC tables view reads it)."""
        return {
            "checked_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "ok": self.ok,
            "breaches": list(self.breaches),
            "versions": dict(self.versions),
            "seconds": round(self.seconds, 3),
        }


def _count(n: int, noun: str) -> str:
    """`1 key`, `2 keys`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _example(row: Any, columns: Sequence[str]) -> str:
    """A key as `ID=5` (composite: `ID=5,LINE=2`)."""
    return ",".join(f"{c}={row[c]}" for c in columns)


def _pending(applied: Column) -> Column:
    """A key's change of an applied file is later than final's and tombstones' (`applied`) and
    than the latest truncate (`cut`): marked applied but not in final."""
    after_cut = F.col("cut").isNull() | (F.col("s") > F.col("cut"))
    return F.col("s").isNotNull() & (applied.isNull() | (F.col("s") > applied)) & after_cut


def _truncate_cut(rows: DataFrame, first_key: str) -> DataFrame:
    """One row: the latest applied truncate's order (a tombstone with null keys), or null.
    Staged changes ordered before it are not pending: they are truncated."""
    tombstone = (F.col("source") == "tombstones") & F.col(first_key).isNull()
    return rows.filter(tombstone).agg(F.max(F.col("o")).alias("cut"))


def _order(prefix: str, columns: Sequence[str]) -> Column:
    """The rank order of a change, (sequence_by..., arrival...), as one comparable struct."""
    return F.struct(*[F.col(f"{prefix}{c}").alias(c) for c in columns])


def _of_applied_files(
    spark: SparkSession, staged: DataFrame, applied: delta.Snapshot | None
) -> DataFrame | None:
    """The staged rows of file versions final has applied (the `applied` marks, joined on the
    arrival's batch and file); None when no file is marked (no applied table: nothing applied
    yet, as overwrite-final reads it too)."""
    if applied is None or not applied.files:
        return None
    marks = delta.read_snapshot(spark, applied, columns=["batch", "file"])
    marks = marks.select(F.col("batch").alias(BATCH), F.col("file").alias(FILE)).distinct()
    return staged.join(F.broadcast(marks), on=[BATCH, FILE], how="left_semi")


def _missing_files(name: str, snapshot: delta.Snapshot) -> str | None:
    """A breach when a data file of the snapshot is not on disk."""
    root = snapshot.path
    present = {str(e.location)[len(str(root)) + 1 :] for e in store_for(root).walk(root)}
    missing = [f.path for f in snapshot.files if f.path not in present]
    if not missing:
        return None
    return (
        f"missing data files in {name}: {_count(len(missing), 'file')}, e.g. {missing[0]} "
        f"(version {snapshot.version})"
    )


def _tally(
    per_key: DataFrame, counted: Column, rules: dict[str, Column], key: Column
) -> tuple[int, dict[str, int], dict[str, Any]]:
    """Over rows of one key each: how many `counted` holds for, how many break each rule, and
    the least key breaking each (an example), in one Spark job."""
    summary = per_key.agg(
        F.sum(F.when(counted, 1).otherwise(0)).alias("__counted"),
        *[F.sum(F.when(rule, 1).otherwise(0)).alias(name) for name, rule in rules.items()],
        *[F.min(F.when(rule, key)).alias(f"{name}__e") for name, rule in rules.items()],
    ).collect()[0]  # metadata: one row of counts and example keys
    found = {name: int(summary[name] or 0) for name in rules}
    return int(summary["__counted"] or 0), found, {n: summary[f"{n}__e"] for n in rules}


def _ranked_rows(
    spark: SparkSession,
    table: TableConfig,
    keys: Sequence[str],
    name: str,
    snapshots: dict[str, delta.Snapshot],
) -> DataFrame | None:
    """One table's rows as the per-key pass reads them: keys, rank order `o`, `source` and
    final's partition `p`; staging's only of applied files. None when it holds none."""
    snapshot = snapshots.get(name)
    if snapshot is None or not snapshot.files:
        return None
    order = [*table.sequence_by, *ARRIVAL]
    column = table.partition_column
    partitioned = name == "final" and column is not None
    wanted = list(dict.fromkeys([*keys, *order, *([str(column)] if partitioned else [])]))
    read = delta.read_snapshot(spark, snapshot, columns=wanted)
    rows = _of_applied_files(spark, read, snapshots.get("applied")) if name == "staging" else read
    if rows is None:
        return None
    partition = F.col(str(column)).cast("string") if partitioned else F.lit(None)
    return rows.select(
        *keys,
        _order("", order).alias("o"),
        F.lit(name).alias("source"),
        partition.cast("string").alias("p"),
    )


def _key_breaches(
    spark: SparkSession,
    table: TableConfig,
    snapshots: dict[str, delta.Snapshot],
) -> tuple[list[str], int]:
    """Final, tombstones and staging checked per key in one pass (one scan of each table's key,
    sequence and arrival columns, one shuffle): every key once in final and in one partition,
    no live key with a later delete, no staged change of an applied file later than final and
    tombstones. Returns the breaches and the number of keys in final.

    Insert-only tables: every event (key and sequence) once in final and in one partition;
    their tombstones and staging are not ranked (see check_loaded).
    """
    keys = [*table.keys, *table.sequence_by] if table.insert_only else list(table.keys)
    sources = ("final",) if table.insert_only else ("final", "tombstones", "staging")
    parts = [
        part
        for name in sources
        if (part := _ranked_rows(spark, table, keys, name, snapshots)) is not None
    ]
    if not parts:
        return [], 0
    rows = reduce(DataFrame.unionByName, parts)
    source, o = F.col("source"), F.col("o")
    per_key = rows.groupBy(*keys).agg(
        F.sum(F.when(source == "final", 1).otherwise(0)).alias("n"),
        F.min(F.when(source == "final", F.col("p"))).alias("p_min"),
        F.max(F.when(source == "final", F.col("p"))).alias("p_max"),
        F.max(F.when(source == "final", o)).alias("f"),
        F.max(F.when(source == "tombstones", o)).alias("t"),
        F.max(F.when(source == "staging", o)).alias("s"),
    )
    if not table.insert_only:
        per_key = per_key.crossJoin(F.broadcast(_truncate_cut(rows, keys[0])))
    moved = F.coalesce(F.col("p_min") != F.col("p_max"), F.lit(False))
    applied = F.greatest(F.col("f"), F.col("t"))
    rules = {"repeated": (F.col("n") > 1) & ~moved, "moved": moved}
    if not table.insert_only:
        rules["deleted"] = (F.col("n") > 0) & F.coalesce(F.col("t") > F.col("f"), F.lit(False))
        rules["pending"] = _pending(applied)
    key = F.struct(*[F.col(k) for k in keys])
    keys_in_final, found, examples = _tally(per_key, F.col("n") > 0, rules, key)
    example = {name: _example(examples[name], keys) for name in rules if found[name]}
    version = {
        n: snapshots[n].version if n in snapshots else -1
        for n in ("final", "tombstones", "applied")
    }
    what = "event" if table.insert_only else "key"
    breaches = []
    if found["repeated"]:
        breaches.append(
            f"duplicate {what}s in final: {_count(found['repeated'], what)}, e.g. "
            f"{example['repeated']} (version {version['final']})"
        )
    if found["moved"]:
        breaches.append(
            f"keys in two partitions of final: {_count(found['moved'], 'key')}, e.g. "
            f"{example['moved']} (version {version['final']})"
        )
    if found.get("deleted"):
        breaches.append(
            "live keys in final with a later delete in tombstones: "
            f"{_count(found['deleted'], 'key')}, e.g. {example['deleted']} (final version "
            f"{version['final']}, tombstones version {version['tombstones']})"
        )
    if found.get("pending"):
        breaches.append(
            "staging has changes of applied files later than final and tombstones (lost): "
            f"{_count(found['pending'], 'key')}, e.g. {example['pending']} (staging version "
            f"{snapshots['staging'].version}, applied version {version['applied']})"
        )
    return breaches, keys_in_final


def check_loaded(
    spark: SparkSession, table: TableConfig, snapshots: dict[str, delta.Snapshot]
) -> tuple[list[str], TableCheckCounts]:
    """The breaches of one loaded set of snapshots, and the counts of the ok line."""
    breaches: list[str] = []
    counts = TableCheckCounts()
    for name, snapshot in snapshots.items():
        missing = _missing_files(name, snapshot)
        if missing:
            breaches.append(missing)
    if breaches:
        return breaches, counts  # reading a table with a missing file would only fail
    keys, order = list(table.keys), [*table.sequence_by, *ARRIVAL]
    final = snapshots.get("final")
    staging = snapshots.get("staging")
    final_rows = None
    if final is not None and final.files:
        final_rows = delta.read_snapshot(spark, final, columns=[*keys, *order])
    found, counts.keys = _key_breaches(spark, table, snapshots)
    breaches += found
    if table.insert_only:
        _check_staged_events(spark, table, staging, snapshots.get("applied"), final_rows, breaches)
        return breaches, counts
    tombstones = snapshots.get("tombstones")
    if tombstones is not None:
        counts.tombstones = tombstones.num_records
    history = snapshots.get("history")
    if table.history and history is not None and history.schema is not None:
        _check_history(spark, table, history, final, final_rows, breaches)
    return breaches, counts


def _check_staged_events(
    spark: SparkSession,
    table: TableConfig,
    staging: delta.Snapshot | None,
    applied: delta.Snapshot | None,
    final_rows: DataFrame | None,
    breaches: list[str],
) -> None:
    """Insert-only: every staged event (key, sequence) of an applied file is in final."""
    keys = list(table.keys)
    if staging is not None and staging.files:
        identity = [*keys, *table.sequence_by]
        read = delta.read_snapshot(spark, staging, columns=[*identity, BATCH, FILE])
        marked = _of_applied_files(spark, read, applied)
        if marked is None:
            return
        staged = marked.select(*identity)
        held = final_rows.select(*identity) if final_rows is not None else staged.limit(0)
        pending = (
            staged.join(held, on=identity, how="left_anti")
            .agg(F.count(F.lit(1)).alias("n"), F.min(F.struct(*identity)).alias("e"))
            .collect()[0]  # metadata: one count and one example key
        )
        if pending["n"]:
            breaches.append(
                "staging has events of applied files not in final (lost): "
                f"{_count(pending['n'], 'event')}, e.g. {_example(pending['e'], identity)} "
                f"(staging version {staging.version})"
            )


def _check_history(
    spark: SparkSession,
    table: TableConfig,
    history: delta.Snapshot,
    final: delta.Snapshot | None,
    final_rows: DataFrame | None,
    breaches: list[str],
) -> None:
    """History's current rows are final's rows (key, sequence and arrival)."""
    keys, order = list(table.keys), [*table.sequence_by, *ARRIVAL]
    identity = [*keys, *order]
    current = (
        delta.read_snapshot(spark, history, columns=[*identity, IS_CURRENT])
        .filter(F.col(IS_CURRENT))
        .select(*identity)
    )
    rows = (final_rows.select(*identity) if final_rows is not None else current.limit(0)).select(
        *[F.col(c).cast(current.schema[c].dataType) for c in identity]
    )
    # Distinct rows: a key twice in final is the uniqueness breach, reported above.
    only_history = current.subtract(rows).withColumn("side", F.lit("history"))
    only_final = rows.subtract(current).withColumn("side", F.lit("final"))
    differing = (
        only_history.unionByName(only_final)
        .groupBy("side")
        .agg(F.count(F.lit(1)).alias("n"), F.min(F.struct(*keys)).alias("e"))
    )
    sides = {r["side"]: r for r in differing.collect()}  # metadata: at most two rows
    if sides:
        example = next(iter(sides.values()))["e"]
        in_history = sides["history"]["n"] if "history" in sides else 0
        in_final = sides["final"]["n"] if "final" in sides else 0
        breaches.append(
            "history's current rows differ from final: "
            f"{_count(in_history, 'row')} only in history, {_count(in_final, 'row')} only in "
            f"final, e.g. {_example(example, keys)} (history version {history.version}, "
            f"final version {final.version if final else -1})"
        )


def load_snapshots(paths: TablePaths) -> dict[str, delta.Snapshot]:
    """The latest snapshot of every table of the table's folder that exists, in TABLES order."""
    loaded = {name: delta.load_snapshot(getattr(paths, name)) for name in TABLES}
    return {name: snapshot for name, snapshot in loaded.items() if snapshot.exists}


def check_table(spark: SparkSession, table: TableConfig, paths: TablePaths) -> CheckResult:
    """Check one table; a breach seen while another step committed is checked again."""
    started = time.perf_counter()
    result = CheckResult(table.name)
    for _ in range(MAX_ROUNDS):
        snapshots = load_snapshots(paths)
        result.versions = {name: snapshots[name].version for name in SHOWN if name in snapshots}
        result.breaches, result.counts = check_loaded(spark, table, snapshots)
        if result.ok:
            break
        now = {name: s.version for name, s in load_snapshots(paths).items()}
        if now == result.versions:
            break  # nothing moved: the breach is the table's, not a run in progress
    result.seconds = time.perf_counter() - started
    return result


def write_check_file(result: CheckResult, paths: TablePaths) -> Location:
    """Write `{warehouse}/{table}/_cdc_check.json` (a reader never sees half a file)."""
    target = paths.table_root / CHECK_FILE
    text = json.dumps(result.document(), indent=2) + "\n"
    store_for(target).write_bytes(target, text.encode())
    return target


def run_check(
    spark: SparkSession, tables: Sequence[TableConfig], warehouse: Location | None = None
) -> list[CheckResult]:
    """Check the tables one after another, writing each one's `_cdc_check.json`."""
    results = []
    for table in tables:
        paths = TablePaths.for_table(table.name, warehouse=warehouse)
        result = check_table(spark, table, paths)
        write_check_file(result, paths)
        results.append(result)
    return results


def select_tables(config: Path | None, names: Sequence[str]) -> list[TableConfig]:
    """The named tables (every valid table when none is named); ConfigError for a bad name."""
    loaded = load_table_configs(config)
    if not names:
        if not loaded.tables and loaded.problems:
            raise ConfigError("; ".join(str(p) for p in loaded.problems))
        for problem in loaded.problems:
            warn(f"check: skipped: {problem}")
        return [loaded.tables[n] for n in sorted(loaded.tables)]
    return [loaded.table(n) for n in dict.fromkeys(names)]


def execute_check(config: Path | None, names: Sequence[str]) -> int:
    """One line per table; 0 when every invariant holds, 1 on a breach, 2 on a bad config."""
    show_warnings_on_stderr()
    try:
        tables = select_tables(config, names)
    except ConfigError as error:
        print(f"error: check: {one_line(error)}", file=sys.stderr, flush=True)
        return 2
    try:
        from spark_jobs.runtime.session import build_spark_session

        spark = build_spark_session("cdc-check")
        results = run_check(spark, tables)
    except Exception as error:
        traceback.print_exc(file=sys.stderr)
        print(f"error: check: {one_line(error)}", file=sys.stderr, flush=True)
        return 1
    for result in results:
        print(result.line(), flush=True)
    summaries.record("tables", [{"table": r.table, **r.document()} for r in results])
    # The Airflow task logs this; the breach lines themselves are in the task's stdout.
    write_summary(check_report(results))
    return exit_code(results)


def check_report(results: Sequence[CheckResult]) -> StepReport[CheckCounts]:
    """The step's summary: tables checked, tables breached, breaches."""
    counts = CheckCounts(
        tables=len(results),
        breached=sum(not r.ok for r in results),
        breaches=sum(len(r.breaches) for r in results),
    )
    return StepReport("check", ",".join(r.table for r in results), "", counts)


def exit_code(results: Sequence[CheckResult]) -> int:
    """0 when every table holds its invariants, 1 when any breaks one."""
    return 0 if all(r.ok for r in results) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry: check [TABLE ...]."""
    parser = argparse.ArgumentParser(prog="check")
    add_check_arguments(parser)
    namespace = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    return execute_check(getattr(namespace, "config", None), namespace.tables)


if __name__ == "__main__":
    sys.exit(main())
