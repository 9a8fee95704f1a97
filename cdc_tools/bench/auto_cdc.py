"""Spark Declarative Pipelines' AUTO CDC on the scheduling cycle's change sets: the peer of
`cdc bench-cycle` (one pipeline, one AUTO CDC flow per table).

    python -m cdc_tools.bench.auto_cdc --tables 65 --changes 300

Spark 4.2's AUTO CDC keeps its target with DataSource V2 row-level operations (MERGE), which no
table format this project can load on Spark 4.2 offers: delta-spark 4.4.0 refuses with
AUTOCDC_TARGET_DOES_NOT_SUPPORT_MERGE, and Maven Central has no Iceberg runtime for Spark 4.2. So
the targets here are Spark's own in-memory row-level table (CATALOG_CLASS, from Spark's catalyst
test jar: `make test` copies it into .tools/): no file is written and nothing is durable. That is the cheapest target AUTO CDC can have, so its times here
are a lower bound of what it takes into a table on storage.

The tool starts its own Spark Connect server (the launcher's settings, local[2], that catalog;
or uses the one `--remote` names, started with those settings: the tests share one), writes each table's change sets to a Delta table (the source, read as a stream), and runs one
pipeline with one flow per table: SCD type 1, keyed and sequenced as the cycle's config (ID by
SEQ; an insert-only table by ID and SEQ, so a duplicate event is kept once), deletes by FLAG.
A warm-up pipeline first (other change sets and targets, as bench-cycle warms its server), then
the measured runs of one pipeline: the first (targets created, the cycle's change sets:
bench_cycle.generate_table's rows) and an incremental run (a second change set per table
appended to the sources). After each, every target is compared with bench_cycle's expectation
of the change sets applied so far. Prints a summary and writes JSON (--output).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cdc_pipeline.paths import project_root
from cdc_tools.bench.cycle import (
    EVENT_COLUMNS,
    UPSERT_COLUMNS,
    BenchTable,
    CycleSpec,
    expected_rows,
    generate_table,
    load_now,
    naive_utc,
)

# make test: the catalyst test jar (under the checkout, as the bundled Kafka broker's .tools/kafka)
TEST_CATALOG_DIR = project_root() / ".tools" / "spark-test-catalog"
CATALOG = "cdc_auto_cdc"
CATALOG_CLASS = (
    "org.apache.spark.sql.connector.catalog.SharedTablesInMemoryRowLevelOperationTableCatalog"
)
DATABASE = "bench"
HOUR = datetime(2024, 1, 1, tzinfo=UTC)
# bench-cycle's change sets: its measured cycle's (seed 42) and its warm-up's (43); the second
# round of each, sequenced after it, from other seeds.
SEED = CycleSpec.seed
LATER = 100
SERVER_MEMORY = "4g"


class AutoCdcCycleError(RuntimeError):
    """A target that does not hold what its change sets give, or a missing test jar."""


def server_conf() -> dict[str, str]:
    """The Connect server's extra settings: the project's jars plus the test jar, the catalog."""
    from spark_jobs.runtime.session import project_jars

    test_jars = sorted(TEST_CATALOG_DIR.glob("spark-catalyst_*-tests.jar"))
    if not test_jars:
        raise AutoCdcCycleError(
            f"no Spark catalyst test jar in {TEST_CATALOG_DIR}: run `make "
            ".tools/spark-test-catalog/.fetched` (docker/spark-test-catalog-pom.xml)"
        )
    jars = [*project_jars(), *test_jars]
    return {
        "spark.jars": ",".join(str(j) for j in jars),
        f"spark.sql.catalog.{CATALOG}": CATALOG_CLASS,
        # The targets live in the driver's heap (Spark's 1 GiB default ran out with 65 of them).
        "spark.driver.memory": SERVER_MEMORY,
    }


def columns_of(table: BenchTable) -> list[str]:
    """The target's columns the check compares, in expected_rows' order."""
    return list(_typed(table))


def source_schema(table: BenchTable) -> str:
    return ", ".join(["FLAG string", *(f"{c} {t}" for c, t in _typed(table).items())])


def _typed(table: BenchTable) -> dict[str, str]:
    return dict(EVENT_COLUMNS if table.kind == "insert_only" else UPSERT_COLUMNS)


def later_round(table: BenchTable, changes: int, seed: int) -> BenchTable:
    """A second change set of the same table, sequenced after the first (SEQ + changes): updates
    and deletes of the same keys; insert-only tables get new events (ID + changes)."""
    rows = []
    for row in generate_table(table.index, changes, HOUR, seed).rows:
        shifted = dict(row, SEQ=row["SEQ"] + changes)
        if table.kind == "insert_only":
            shifted["ID"] = row["ID"] + changes
        rows.append(shifted)
    return BenchTable(table.index, table.kind, tuple(rows))


def write_source(spark: Any, table: BenchTable, path: Path, *, append: bool) -> None:
    """The change set as rows of a Delta table (the flow's streaming source)."""
    columns = ["FLAG", *_typed(table)]
    data = [tuple(naive_utc(row.get(c)) for c in columns) for row in table.rows]
    frame = spark.createDataFrame(data, source_schema(table))
    frame.write.format("delta").mode("append" if append else "overwrite").save(str(path))


@dataclass(frozen=True)
class Flow:
    """One AUTO CDC flow (SCD type 1, deletes by FLAG): the Delta table at `source`, read as a
    stream, into the streaming table `target`."""

    target: str
    source: str
    keys: tuple[str, ...]
    sequence_by: str
    format: str | None = None  # the target's; None: the catalog's own


def run_flows(
    spark: Any, catalog: str, database: str, flows: Sequence[Flow], storage: str
) -> float:
    """One run of a pipeline of `flows` in `catalog`.`database` (checkpoints under `storage`);
    the seconds `start_run` took (the graph's registration not counted)."""
    from pyspark import pipelines as dp
    from pyspark.pipelines.add_pipeline_analysis_context import add_pipeline_analysis_context
    from pyspark.pipelines.graph_element_registry import graph_element_registration_context
    from pyspark.pipelines.spark_connect_graph_element_registry import (
        SparkConnectGraphElementRegistry,
    )
    from pyspark.pipelines.spark_connect_pipeline import create_dataflow_graph, start_run

    graph = create_dataflow_graph(spark, catalog, database, {})
    registry = SparkConnectGraphElementRegistry(spark, graph)
    with (
        graph_element_registration_context(registry),
        add_pipeline_analysis_context(spark=spark, dataflow_graph_id=graph, flow_name=None),
    ):
        for flow in flows:
            dp.temporary_view(name=f"{flow.target}_changes")(_stream_of(spark, flow.source))
            dp.create_streaming_table(flow.target, format=flow.format)
            dp.create_auto_cdc_flow(
                target=flow.target,
                source=f"{flow.target}_changes",
                keys=list(flow.keys),
                sequence_by=flow.sequence_by,
                apply_as_deletes="FLAG = 'D'",
                except_column_list=["FLAG"],
                stored_as_scd_type=1,
            )
    started = time.perf_counter()
    for _ in start_run(spark, graph, None, False, None, False, storage=storage):
        pass
    return round(time.perf_counter() - started, 2)


def run_pipeline(
    spark: Any, tables: Sequence[BenchTable], sources: Path, storage: str, prefix: str
) -> float:
    """One run of the pipeline with one flow per table into `prefix` + its name: keyed and
    sequenced as the cycle's config (insert-only tables by ID and SEQ)."""
    flows = [
        Flow(
            target=prefix + table.name,
            source=str(sources / table.name),
            keys=("ID", "SEQ") if table.kind == "insert_only" else ("ID",),
            sequence_by="SEQ",
        )
        for table in tables
    ]
    return run_flows(spark, CATALOG, DATABASE, flows, storage)


def _stream_of(spark: Any, source: str) -> Callable[[], Any]:
    """A flow's source: the Delta table at `source`, read as a stream."""

    def changes() -> Any:
        return spark.readStream.format("delta").load(source)

    return changes


def check_targets(spark: Any, applied: Sequence[BenchTable], prefix: str) -> int:
    """How many targets hold exactly the rows of their change sets (bench_cycle's expectation,
    computed in Python); raises naming the first that does not."""
    for table in applied:
        columns = columns_of(table)
        width = len(columns)
        expected = [row[:width] for row in expected_rows(table)]
        frame = spark.table(f"{CATALOG}.{DATABASE}.{prefix}{table.name}").select(*columns)
        found = sorted(tuple(naive_utc(v) for v in row) for row in frame.collect())
        if found != expected:
            differ = [(f, e) for f, e in zip(found, expected, strict=False) if f != e]
            raise AutoCdcCycleError(
                f"AUTO CDC target {prefix}{table.name}: {len(found)} rows, expected "
                f"{len(expected)}; first difference (found, expected): "
                f"{differ[0] if differ else 'none in the common rows'}"
            )
    return len(applied)


def drop_targets(spark: Any, count: int, prefix: str) -> None:
    """Drop the pipeline's targets and AUTO CDC's state tables beside them."""
    for index in range(count):
        name = prefix + BenchTable.without_rows(index).name
        for table in (name, f"__spark_autocdc_aux_state_{name}"):
            spark.sql(f"DROP TABLE IF EXISTS {CATALOG}.{DATABASE}.{table}")


def combined(first: BenchTable, second: BenchTable) -> BenchTable:
    return replace(first, rows=first.rows + second.rows)


def measure(spark: Any, count: int, changes: int, work: Path, *, warm: bool) -> dict[str, Any]:
    """The warm-up (unless not `warm`), then the measured first and incremental runs of one
    pipeline of `count` flows, each checked; the seconds and the exact targets."""
    warm_up = None
    if warm:
        warm_up = _two_runs(spark, count, changes, work / "warm-up", "w_", SEED + 1)
        drop_targets(spark, count, "w_")  # their rows out of the driver's heap
    first, incremental, exact = _two_runs(spark, count, changes, work / "measured", "t_", SEED)
    return {
        "warm_up_seconds": None if warm_up is None else warm_up[:2],
        "first_run_seconds": first,
        "incremental_run_seconds": incremental,
        "incremental_seconds_per_flow": round(incremental / count, 3),
        "exact_targets": exact,
    }


def _two_runs(
    spark: Any, count: int, changes: int, folder: Path, prefix: str, seed: int
) -> tuple[float, float, int]:
    """A pipeline's first run over one change set per table, then its incremental run over a
    second one; both checked. (seconds, seconds, exact targets after the second)."""
    sources, storage = folder / "sources", (folder / "storage").resolve().as_uri()
    tables = [generate_table(i, changes, HOUR, seed) for i in range(count)]
    for table in tables:
        write_source(spark, table, sources / table.name, append=False)
    first = run_pipeline(spark, tables, sources, storage, prefix)
    check_targets(spark, tables, prefix)
    print(f"auto-cdc-cycle [{folder.name}]: first run {first} s, {count} targets exact", flush=True)
    later = [later_round(table, changes, seed + LATER) for table in tables]
    for table in later:
        write_source(spark, table, sources / table.name, append=True)
    incremental = run_pipeline(spark, tables, sources, storage, prefix)
    exact = check_targets(
        spark, [combined(a, b) for a, b in zip(tables, later, strict=True)], prefix
    )
    print(
        f"auto-cdc-cycle [{folder.name}]: incremental run {incremental} s, {exact} exact",
        flush=True,
    )
    return first, incremental, exact


def run(
    tables: int, changes: int, output: Path, *, warm: bool = True, remote: str | None = None
) -> dict[str, Any]:
    """Start a Connect server with the in-memory catalog (or use the one at `remote`, started
    with `server_conf()`), measure (`measure`), stop it; the figures with the machine's load
    before, also written to `output`/latest.json."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from cdc_airflow.local import connect_server

    load = load_now()
    output.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="cdc-auto-cdc-"))
    server, url = None, remote
    if url is None:
        server = connect_server.start(
            master="local[2]", conf=server_conf(), log_path=output / "server.log"
        )
        url = server.url
    try:
        spark = ConnectSession.builder.remote(url).create()
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.{DATABASE}")
        if remote is not None:  # a shared server may hold an earlier run's targets
            drop_targets(spark, tables, "t_")
            drop_targets(spark, tables, "w_")
        figures = measure(spark, tables, changes, work, warm=warm)
        spark.stop()
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "command": f"python -m cdc_tools.bench.auto_cdc --tables {tables} --changes {changes}",
        "tables": tables,
        "changes": changes,
        "target": f"Spark's in-memory row-level table ({CATALOG_CLASS}): nothing written",
        "spark": _spark_version(),
        "server": f"local[2], spark.driver.memory {SERVER_MEMORY}"
        if remote is None
        else f"the Connect server at {remote}",
        "load_before": load,
        **figures,
    }
    (output / "latest.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def beside_cycle(spec: CycleSpec, document: dict[str, Any]) -> dict[str, Any]:
    """`cdc bench-cycle --auto-cdc`: the cycle's tables and change sets through one pipeline of
    AUTO CDC flows, in the cycle's latest.json under `auto_cdc`."""
    print("bench-cycle [auto-cdc]: the same change sets through Spark's AUTO CDC", flush=True)
    result = run(spec.tables, spec.changes, spec.output / "auto-cdc", warm=spec.warm)
    print(f"bench-cycle [auto-cdc]: {summary(result)}", flush=True)
    document["auto_cdc"] = result
    (spec.output / "latest.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    return document


def summary(result: dict[str, Any]) -> str:
    return (
        f"auto-cdc-cycle: {result['tables']} AUTO CDC flows in one pipeline, "
        f"{result['changes']} changes each: first run {result['first_run_seconds']} s, "
        f"incremental run {result['incremental_run_seconds']} s "
        f"({result['incremental_seconds_per_flow']} s per flow); "
        f"{result['exact_targets']}/{result['tables']} targets exact; warm-up "
        f"{result['warm_up_seconds']}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_tools.bench.auto_cdc")
    parser.add_argument("--tables", type=int, default=65)
    parser.add_argument("--changes", type=int, default=300, help="changes per table and run")
    parser.add_argument("--output", type=Path, default=Path("bench-results/auto-cdc-cycle"))
    parser.add_argument("--no-warm-up", action="store_true", help="measure on a fresh server")
    parser.add_argument(
        "--remote",
        default=None,
        help="a running Connect server started with server_conf()'s settings (sc://host:port); "
        "default: the tool starts its own and stops it",
    )
    args = parser.parse_args(argv)
    result = run(
        args.tables, args.changes, args.output, warm=not args.no_warm_up, remote=args.remote
    )
    print(f"{summary(result)}; results in {args.output / 'latest.json'}", flush=True)
    return 0


def _spark_version() -> str:
    import pyspark

    return pyspark.__version__


if __name__ == "__main__":
    sys.exit(main())
