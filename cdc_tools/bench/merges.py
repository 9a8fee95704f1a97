"""`cdc bench`: overwrite-final against a full rebuild and two MERGEs, on the same changes.

For every case of the sweep (touched fraction of partitions at size x1, and table size with a
fixed change set) the harness builds a final table with Spark, lands one change set (updates,
partition moves, inserts and key-only deletes, all in the touched partitions), stages it once,
and applies it every way to its own copy of the table:

- `overwrite_final`: this project's step (rank the changes against the touched partitions,
  replace them in one commit);
- `full_rebuild`: seed 001's compaction: rank every row of the table with the changes and
  rewrite the whole table;
- `delta_rs_merge`: `DeltaTable.merge` upsert/delete of the latest change per key (newer
  sequence only), in delta-rs's own engine, streamed (`streamed_exec=True`, deltalake 1.6's
  default); `delta_rs_merge_unstreamed` the same with `streamed_exec=False` (the source's key
  statistics prune the target's files);
- `delta_spark_merge`: the same MERGE as Delta Lake's own `MERGE INTO` on the same Spark session
  (delta-spark, the jars `make install` fetches): what a hand-written Spark MERGE job does;
  `delta_spark_merge_dv` the same on a copy with deletion vectors enabled (set before the run,
  not timed). Left out, and said so in the JSON, when the session has no Delta Lake extension.

With `partition_stable` every MERGE also names the partitions the changes touch in its
condition (`cdc_tools.bench.peers`). `--methods` picks the methods (overwrite_final always runs:
the others are checked against it). `--kafka-messages N` also measures the stage step of a
`source: kafka` table over N messages (`cdc_tools.bench.kafka_stage`): messages staged per
second.

All results must hold the same rows (checked with Spark, both ways). Per method it
records the wall time, the driver's peak memory (JVM and Python, Linux VmHWM reset before each
method), the Spark stages it ran and their times (Spark's REST API, by job group) and the
files and bytes it wrote. Results go to `{output}/bench-<time>.json` (and `latest.json`) with
a PNG plot of time vs touched fraction and time vs table size.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_pipeline.config import TableConfig
from cdc_pipeline.counts import StageCounts
from cdc_pipeline.intervals import HourBatch, Interval
from cdc_pipeline.paths import TablePaths
from cdc_tools.bench.peers import (
    DELTA_RS_UNSTREAMED,
    DELTA_SPARK_DV,
    DELTA_SPARK_METHODS,
    delta_rs_merge,
    delta_rs_settings,
    delta_rs_streamed_default,
    delta_spark_merge,
    enable_deletion_vectors,
    full_rebuild,
    has_deletion_vectors,
    has_delta_spark,
)
from spark_jobs import delta
from spark_jobs.overwrite.final_table import final_schema
from spark_jobs.overwrite_final import run_overwrite_final
from spark_jobs.rules.transforms import ARRIVAL, BATCH, FILE, ROW, persisted
from spark_jobs.runtime.context import StepContext
from spark_jobs.runtime.report import StepReport
from spark_jobs.runtime.session import is_connect
from spark_jobs.stage import run_stage

TABLE = "bench"
BASE_TIME = datetime(2024, 1, 1, tzinfo=UTC)
CHANGE_HOUR = datetime(2024, 1, 2, tzinfo=UTC)
CHANGE_WINDOW = Interval(CHANGE_HOUR, CHANGE_HOUR.replace(hour=1))  # the hour a case stages
METHODS = (
    "overwrite_final",
    "full_rebuild",
    "delta_rs_merge",
    DELTA_RS_UNSTREAMED,
    "delta_spark_merge",
    DELTA_SPARK_DV,
)


@dataclass(frozen=True)
class BenchSpec:
    """What to measure; the defaults take about ten minutes on 2 cores."""

    rows: int = 5_000_000
    partitions: int = 100
    key_width: int = 1
    changes: int = 20_000
    fractions: tuple[float, ...] = (0.01, 0.05, 0.25)
    sizes: tuple[int, ...] = (1, 4)
    size_sweep_fraction: float = 0.01
    output: Path = Path("bench-results")
    warm_up: bool = True  # a small throwaway case first (JIT, caches)
    repeats: int = 3  # overwrite_final and MERGE run this often, each on a fresh copy: median
    # Runs of each repeated method at the case's own size before those counted (each on a fresh
    # copy; their seconds kept as `warm_up_runs`): the operating point is a warm Spark server,
    # and a JVM's compiled code for a size comes only from running at that size.
    warm_up_runs: int = 2
    # "ordered": K1 is the row id, so each file's key range is narrow and new keys lie above
    # every range; "spread": K1 is a bijective scramble of the id (a hash or UUID-like key), so
    # every file's range covers the whole key space and statistics prune nothing.
    key_layout: str = "ordered"
    partition_stable: bool = False  # declare the table partition_stable; the changes move no key
    methods: tuple[str, ...] = METHODS  # the methods measured (overwrite_final always)
    kafka_messages: int = 0  # messages of the Kafka staging measurement (0: not measured)
    kafka_partitions: int = 3  # of its topic

    @classmethod
    def smoke(cls, output: Path) -> BenchSpec:
        """Tiny sizes: the harness end to end (a fraction and a size sweep, the four methods, the
        repeat and warm-up paths) in about 2 minutes on 2 cores."""
        return cls(
            rows=4_000,
            partitions=10,
            key_width=2,
            changes=200,
            fractions=(0.1,),  # one fraction case besides the size sweep's (about 90 s each)
            sizes=(1, 2),
            size_sweep_fraction=0.1,
            output=output,
            warm_up=False,
            repeats=2,  # the repeat path too: each run must start from the same state
            warm_up_runs=1,  # and the warm-up runs before them
            # Not the variants (the unstreamed delta-rs MERGE, deletion vectors): about 70 s
            # more here; tests/spark/test_bench_peers.py runs them against overwrite-final.
            methods=tuple(m for m in METHODS if m not in (DELTA_RS_UNSTREAMED, DELTA_SPARK_DV)),
        )


def bench_table(spec: BenchSpec, *, topic: str | None = None) -> TableConfig:
    """The config row of the benchmark table: reading landed Parquet files, or (a `topic`) the
    flat JSON messages of that Kafka topic."""
    keys = [f"K{i}" for i in range(1, spec.key_width + 1)]
    columns = {k: "bigint" for k in keys}
    columns.update(REGION="int", V1="bigint", V2="string", V3="double", TS="timestamp")
    source: dict[str, Any] = (
        {"file_format": "parquet"}
        if topic is None
        else {"source": "kafka", "topic": topic, "change_format": "flat"}
    )
    return TableConfig(
        name=TABLE,
        **source,
        columns=columns,
        keys=keys,
        sequence_by=["TS"],
        partition_expression="REGION",
        partition_column="REGION_P",
        partition_stable=spec.partition_stable,
    )


SPREAD_MULTIPLIER = 2654435761  # odd: multiplying modulo 2^40 is a bijection on 0 .. 2^40-1
SPREAD_MASK = (1 << 40) - 1


def _key_columns(ids: Any, spec: BenchSpec) -> list[Any]:
    """K1 is the id, or a scramble of it (`key_layout` "spread"); further key columns are
    derived from the id (a composite, still unique key)."""
    first = ids
    if spec.key_layout == "spread":
        first = (ids * F.lit(SPREAD_MULTIPLIER)).bitwiseAND(F.lit(SPREAD_MASK))
    return [
        first.alias("K1"),
        *[(ids * i % 9973).alias(f"K{i}") for i in range(2, spec.key_width + 1)],
    ]


def base_rows(spark: SparkSession, spec: BenchSpec, rows: int) -> DataFrame:
    """The table's rows as final stores them: id i lives in partition i % partitions."""
    ids = F.col("id")
    region = (ids % spec.partitions).cast("int")
    return spark.range(rows).select(
        *_key_columns(ids, spec),
        region.alias("REGION"),
        (ids * 7).alias("V1"),
        F.concat(F.lit("value-"), ids.cast("string")).alias("V2"),
        (ids / 3.0).alias("V3"),
        F.lit(BASE_TIME).cast("timestamp").alias("TS"),
        region.alias("REGION_P"),
        F.lit("2024-01-01T00").alias(BATCH),
        F.lit("base.parquet").alias(FILE),
        ids.alias(ROW),
    )


def change_rows(spark: SparkSession, spec: BenchSpec, rows: int, touched: int) -> DataFrame:
    """One change set, all in partitions 0..touched-1: 85% updates, 5% partition moves (to
    another touched partition; plain updates when `partition_stable`), 5% inserts, 5%
    key-only deletes, each key once. Its size is capped by the keys the x1 table has in those
    partitions, so every size gets the same set."""
    in_touched = max(1, spec.rows // spec.partitions) * touched
    count = min(spec.changes, in_touched)
    n = F.col("id")
    # Change n touches the n-th existing key of the touched partitions.
    key = (n % touched) + (n / touched).cast("long") * spec.partitions
    kind = n % 20
    is_insert = kind == 18
    is_delete = kind == 19
    is_move = (kind == 17) & F.lit(not spec.partition_stable)
    ids = F.when(is_insert, F.lit(rows) + n * spec.partitions + n % touched).otherwise(key)
    region = (ids % spec.partitions).cast("int")
    moved = ((region + 1) % touched).cast("int")
    return spark.range(count).select(
        *_key_columns(ids, spec),
        F.when(is_delete, F.lit(None)).when(is_move, moved).otherwise(region).alias("REGION"),
        F.when(is_delete, F.lit(None)).otherwise(ids * 7 + 1).alias("V1"),
        F.when(is_delete, F.lit(None))
        .otherwise(F.concat(F.lit("changed-"), ids.cast("string")))
        .alias("V2"),
        F.when(is_delete, F.lit(None)).otherwise(ids / 7.0).alias("V3"),
        F.lit(CHANGE_HOUR).cast("timestamp").alias("TS"),
        F.when(is_insert, F.lit("I"))
        .when(is_delete, F.lit("D"))
        .otherwise(F.lit("U"))
        .alias("FLAG"),
    )


def _jvm_pid(spark: SparkSession) -> int | None:
    """The driver JVM's pid; None under Spark Connect (the JVM is the server's, maybe remote)."""
    if is_connect(spark):
        return None
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]


# This process's mark on its tags: a Connect server keeps the jobs of every bench it served,
# and the same case labels would otherwise find another run's jobs too.
_BENCH_RUN = uuid.uuid4().hex[:8]


def _tag(group: str) -> str:
    """The Spark Connect tag of `group` in this process (a tag holds no comma)."""
    return f"{group.replace(',', '_')}-{_BENCH_RUN}"


def _set_group(spark: SparkSession, group: str) -> None:
    """Mark the next jobs as `group`: a job group (classic), a tag under Spark Connect."""
    if is_connect(spark):
        spark.clearTags()
        spark.addTag(_tag(group))
    else:
        spark.sparkContext.setJobGroup(group, group)


def _reset_peak(pid: int | None) -> None:
    """Reset the process's peak RSS (VmHWM) so the next method's peak is its own (Linux)."""
    if pid is None:
        return
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def _peak_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _spark_stages(spark: SparkSession, group: str, seconds: float | None = None) -> dict[str, Any]:
    """The jobs and stages of `group` from Spark's REST API: counts, wall and executor times,
    and (given the step's `seconds`) how much of the step was spent outside any Spark job: the
    driver's planning calls, Python, listings and the delta-rs commit.

    Under Spark Connect the jobs are the server's, found by the tag `_set_group` added, when the
    server runs its UI (`spark.ui.enabled=true`) on the Connect URL's host; else empty.
    """
    connect = is_connect(spark)
    url = _server_ui(spark) if connect else spark.sparkContext.uiWebUrl
    if not url:
        return {}

    def get(path: str) -> Any:
        with urllib.request.urlopen(f"{url}/api/v1/{path}", timeout=10) as r:
            return json.loads(r.read())

    try:
        app = get("applications")[0]["id"]
        every = get(f"applications/{app}/jobs")
        stages_done = get(f"applications/{app}/stages?status=complete")
    except (OSError, ValueError, KeyError, IndexError):
        return {}
    tag = "_Tag_" + _tag(group)
    jobs = [
        j
        for j in every
        if (
            any(t.endswith(tag) for t in j.get("jobTags", []))
            if connect
            else j.get("jobGroup") == group
        )
    ]
    stage_ids = {s for j in jobs for s in j.get("stageIds", [])}
    stages = [s for s in stages_done if s["stageId"] in stage_ids]
    slowest = sorted(stages, key=_millis, reverse=True)[:3]
    job_wall = _union_ms([_interval(j) for j in jobs])
    out: dict[str, Any] = {
        "jobs": len(jobs),
        "job_wall_ms": job_wall,
        "stages": len(stages),
        "stage_wall_ms": sum(_millis(s) for s in stages),
        "executor_run_ms": sum(int(s.get("executorRunTime", 0)) for s in stages),
        "slowest": [
            {"name": s.get("name", "")[:80], "ms": _millis(s), "tasks": s.get("numTasks")}
            for s in slowest
        ],
        "job_list": [
            {"name": j.get("name", "")[:80], "ms": _millis(j)}
            for j in sorted(jobs, key=lambda j: int(j.get("jobId", 0)))
        ],
    }
    if seconds is not None:
        out["outside_jobs_ms"] = max(0, round(seconds * 1000) - job_wall)
    return out


def _server_ui(spark: SparkSession) -> str | None:
    """The Connect server's UI address (its REST API), if it runs one."""
    try:
        if spark.conf.get("spark.ui.enabled", "true") != "true":
            return None
        port = spark.conf.get("spark.ui.port", "4040")
    except Exception:  # a setting the server does not expose
        return None
    remote = os.environ.get("CDC_SPARK_REMOTE", "")
    host = urllib.parse.urlsplit(remote.replace("sc://", "http://", 1)).hostname or "127.0.0.1"
    return f"http://{host}:{port}"


def _when(text: str) -> datetime:
    return datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")


def _interval(item: dict[str, Any]) -> tuple[datetime, datetime] | None:
    """A job's or stage's (submission, completion) from the REST API; None while unknown."""
    if not item.get("submissionTime") or not item.get("completionTime"):
        return None
    return _when(item["submissionTime"]), _when(item["completionTime"])


def _millis(item: dict[str, Any]) -> int:
    span = _interval(item)
    return 0 if span is None else int((span[1] - span[0]).total_seconds() * 1000)


def _union_ms(spans: Sequence[tuple[datetime, datetime] | None]) -> int:
    """Milliseconds covered by at least one of the spans (overlapping jobs counted once)."""
    total, end = 0.0, None
    for start, stop in sorted(s for s in spans if s is not None):
        if end is None or start > end:
            total += (stop - start).total_seconds()
            end = stop
        elif stop > end:
            total += (stop - end).total_seconds()
            end = stop
    return int(total * 1000)


def _files(path: Path) -> dict[str, int]:
    """The table's data files (paths relative to it) and deletion vector files: their sizes."""
    snapshot = delta.load_snapshot(path)
    vectors = {p.name: p.stat().st_size for p in path.glob("deletion_vector_*.bin")}
    return {f.path: f.size for f in snapshot.files} | vectors


@dataclass
class Measure:
    """One method on one case."""

    method: str
    seconds: float  # the median of `runs`
    jvm_peak_mb: float | None
    python_peak_mb: float | None
    files_written: int
    bytes_written: int
    spark: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)
    runs: list[float] = field(default_factory=list)  # seconds of every repetition
    warm_up_runs: list[float] = field(default_factory=list)  # seconds of the runs before them


def _measure(
    spark: SparkSession,
    label: str,
    method: str,
    final: Path,
    action: Callable[[], dict[str, Any]],
) -> Measure:
    group = f"{label}/{method}"  # the Spark job group its stages are found by
    jvm = _jvm_pid(spark)
    before = _files(final)
    _reset_peak(jvm)
    _reset_peak(os.getpid())
    _set_group(spark, group)
    started = time.perf_counter()
    counts = action()
    seconds = time.perf_counter() - started
    _set_group(spark, "bench")
    after = _files(final)
    new = {p: s for p, s in after.items() if p not in before}
    return Measure(
        method=method,
        seconds=round(seconds, 2),
        runs=[round(seconds, 2)],
        jvm_peak_mb=_peak_mb(jvm),
        python_peak_mb=_peak_mb(os.getpid()),
        files_written=len(new),
        bytes_written=sum(new.values()),
        spark=_spark_stages(spark, group, seconds),
        counts=counts,
    )


def repeated_measure(
    spark: SparkSession,
    spec: BenchSpec,
    label: str,
    method: str,
    final: Path,
    *,
    action: Callable[[], dict[str, Any]],
    fresh: Callable[[], None],
) -> Measure:
    """`spec.warm_up_runs` runs, then the median of `spec.repeats` more, each on a fresh copy of
    the base table (`fresh` makes it, before every run but the first)."""
    measures = []
    for run in range(spec.warm_up_runs + spec.repeats):
        if run:
            fresh()
        measures.append(_measure(spark, f"{label}/{run}", method, final, action))
    warm_up, counted = measures[: spec.warm_up_runs], measures[spec.warm_up_runs :]
    median = sorted(counted, key=lambda m: m.seconds)[len(counted) // 2]
    return replace(
        median,
        runs=[m.seconds for m in counted],
        warm_up_runs=[m.seconds for m in warm_up],
    )


SDP_TARGET = "cdc_bench_auto_cdc_target"


def _run_auto_cdc_pipeline(spark: SparkSession, source: str, storage: str) -> float:
    """One run of a pipeline with one AUTO CDC flow from the Delta table at `source` into
    SDP_TARGET, a Delta table (seconds taken)."""
    from cdc_tools.bench.auto_cdc import Flow, run_flows

    flow = Flow(SDP_TARGET, source, ("ID",), "TS", format="delta")
    return run_flows(spark, "spark_catalog", "default", [flow], storage)


def auto_cdc_peer(spark: SparkSession, work: Path) -> dict[str, Any]:
    """Whether Spark Declarative Pipelines' AUTO CDC (`create_auto_cdc_flow`, SCD type 1, keys
    and sequence as ours) can apply changes into a Delta target on this Spark: a pipeline of
    1,000 inserts, then an update and a delete, run twice on the session's server. It
    is measured against overwrite-final only when it can; otherwise the JSON says why (Spark
    4.2's AUTO CDC needs a target with DSv2 row-level operations, which delta-spark 4.4.0's
    tables do not offer)."""
    if not is_connect(spark):
        return {"available": False, "reason": "needs a Spark Connect session (CDC_SPARK_REMOTE)"}
    if not has_delta_spark(spark):
        return {"available": False, "reason": "the session has no Delta Lake extension"}
    source = str(work / "auto-cdc-source")
    storage = (work / "auto-cdc-storage").resolve().as_uri()

    def changes(rows: list[tuple[int, str, int | None, str]]) -> DataFrame:
        frame = spark.createDataFrame(rows, "ID bigint, FLAG string, V bigint, TS string")
        return frame.withColumn("TS", F.col("TS").cast("timestamp"))

    try:
        changes([(i, "I", i, "2024-01-01 00:00:00") for i in range(1000)]).write.format(
            "delta"
        ).save(source)
        first = _run_auto_cdc_pipeline(spark, source, storage)
        changes(
            [(1, "U", 100, "2024-01-01 01:00:00"), (2, "D", None, "2024-01-01 01:00:00")]
        ).write.format("delta").mode("append").save(source)
        second = _run_auto_cdc_pipeline(spark, source, storage)
        rows = spark.table(SDP_TARGET).count()
        return {"available": rows == 999, "first_run_seconds": first, "second_run_seconds": second}
    except Exception as error:
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return {"available": False, "reason": text}
    finally:
        with contextlib.suppress(Exception):
            spark.sql(f"DROP TABLE IF EXISTS spark_catalog.default.{SDP_TARGET}")


def _check_identical(
    spark: SparkSession, label: str, finals: dict[str, Path], columns: list[str]
) -> bool:
    """True when every method's final holds overwrite-final's rows; else fails naming them."""
    prints = {m: rows_fingerprint(_rows(spark, path, columns)) for m, path in finals.items()}
    differ = [m for m, value in prints.items() if value != prints[METHODS[0]]]
    if differ:
        raise RuntimeError(
            f"bench case {label}: {', '.join(differ)} disagree(s) with {METHODS[0]} on the rows"
        )
    return True


def _rows(spark: SparkSession, path: Path, columns: list[str]) -> DataFrame:
    """The table's rows: read as the steps read (the log's files), or with deletion vectors by
    delta-spark's reader (a file's deleted rows are in its vector, not gone from the file)."""
    snapshot = delta.load_snapshot(path)
    if has_deletion_vectors(snapshot):
        return spark.read.format("delta").load(str(path.resolve())).select(*columns)
    return delta.read_snapshot(spark, snapshot, columns=columns)


def rows_fingerprint(frame: DataFrame) -> tuple[Any, ...]:
    """The rows as a multiset, in one pass and no shuffle: their count and the sums of two
    independent hashes of each row (its values and which of them are null, so a value moved
    to the next null column changes it). Equal for the same rows in any order or files; two
    `exceptAll`s per method, which it replaces, took most of a 100M-row bench's 20 minutes."""
    row = [F.col(c) for c in frame.columns] + [F.isnull(c) for c in frame.columns]
    wide = "decimal(38,0)"
    (found,) = frame.agg(
        F.count(F.lit(1)),
        F.sum(F.xxhash64(*row).cast(wide)),
        F.sum(F.hash(*row).cast(wide)),
    ).collect()
    return tuple(found)


def land_changes(
    spark: SparkSession, spec: BenchSpec, landing: Path, rows: int, touched: int
) -> None:
    """The case's change set as one Parquet file in the change hour's landing folder."""
    folder = landing / TABLE / HourBatch(CHANGE_HOUR).folder
    change_rows(spark, spec, rows, touched).coalesce(1).write.mode("overwrite").parquet(
        str(folder / "_tmp")
    )
    for part in (folder / "_tmp").glob("*.parquet"):
        part.rename(folder / "changes.parquet")
    shutil.rmtree(folder / "_tmp")


def timed_stage(
    context: StepContext, window: Interval, group: str
) -> tuple[StepReport[StageCounts], float, dict[str, Any]]:
    """Stage the case's change set: the report, seconds and its Spark jobs."""
    _set_group(context.spark, group)
    started = time.perf_counter()
    staged = run_stage(context, window)
    seconds = round(time.perf_counter() - started, 2)
    _set_group(context.spark, "bench")
    return staged, seconds, _spark_stages(context.spark, group, seconds)


def check_methods(methods: Sequence[str]) -> None:
    """ValueError naming the methods that are not among METHODS, in the order given."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(
            f"unknown method(s) {', '.join(unknown)}: choose from {', '.join(METHODS)}"
        )


def available_methods(spark: SparkSession, spec: BenchSpec) -> tuple[list[str], dict[str, str]]:
    """The methods of `spec.methods` (and overwrite_final) this session and deltalake can run,
    in METHODS' order, and why each other one asked for is left out."""
    check_methods(spec.methods)
    asked = [m for m in METHODS if m == METHODS[0] or m in spec.methods]
    why: dict[str, str] = {}
    if not has_delta_spark(spark):
        why |= dict.fromkeys(DELTA_SPARK_METHODS, "the session has no Delta Lake extension")
    if delta_rs_streamed_default() is None:
        why[DELTA_RS_UNSTREAMED] = "this deltalake's merge has no streamed_exec argument"
    return [m for m in asked if m not in why], {m: r for m, r in why.items() if m in asked}


def copy_base(spark: SparkSession, method: str, base: Path, final: Path) -> None:
    """A fresh copy of the base table for `method`; the deletion vector MERGE's copy gets
    deletion vectors enabled (a commit before its run, not timed)."""
    shutil.rmtree(final, ignore_errors=True)
    shutil.copytree(base, final)
    if method == DELTA_SPARK_DV:
        enable_deletion_vectors(spark, final)


def peer_actions(
    spark: SparkSession, table: TableConfig, finals: dict[str, Path], changes: DataFrame
) -> dict[str, Callable[[], dict[str, Any]]]:
    """Each peer's run on its own copy (`finals`) with the staged `changes`."""
    streamed = None if delta_rs_streamed_default() is None else True
    return {
        "full_rebuild": lambda: full_rebuild(spark, table, finals["full_rebuild"], changes),
        "delta_rs_merge": lambda: delta_rs_merge(
            table, finals["delta_rs_merge"], changes, streamed=streamed
        ),
        DELTA_RS_UNSTREAMED: lambda: delta_rs_merge(
            table, finals[DELTA_RS_UNSTREAMED], changes, streamed=False
        ),
        "delta_spark_merge": lambda: delta_spark_merge(
            spark, table, finals["delta_spark_merge"], changes
        ),
        DELTA_SPARK_DV: lambda: delta_spark_merge(spark, table, finals[DELTA_SPARK_DV], changes),
    }


def run_case(
    spark: SparkSession,
    spec: BenchSpec,
    work: Path,
    base: Path,
    rows: int,
    fraction: float,
    *,
    label: str,
) -> dict[str, Any]:
    """Stage one change set, then apply it every way to copies of the base table."""
    table = bench_table(spec)
    touched = max(1, math.ceil(fraction * spec.partitions))
    case_dir = work / label
    landing = case_dir / "landing"
    land_changes(spark, spec, landing, rows, touched)
    methods, _ = available_methods(spark, spec)
    finals = {method: case_dir / method / TABLE / "final" for method in methods}
    for method, target in finals.items():
        copy_base(spark, method, base, target)
    own = TablePaths(TABLE, landing, case_dir / "overwrite_final")
    context = StepContext(spark, table, own)
    staged, stage_seconds, stage_spark = timed_stage(context, CHANGE_WINDOW, f"{label}/stage")
    changes = persisted(delta.read_snapshot(spark, delta.load_snapshot(own.staging)))
    changes.count()

    def fresh(method: str) -> None:
        copy_base(spark, method, base, finals[method])
        if method == "overwrite_final":
            # Back to the state before the first run: no tombstones, nothing applied.
            shutil.rmtree(own.tombstones, ignore_errors=True)
            shutil.rmtree(own.applied, ignore_errors=True)

    actions = peer_actions(spark, table, finals, changes)
    actions["overwrite_final"] = lambda: dict(run_overwrite_final(context, CHANGE_WINDOW).counts)
    # The full rebuild runs once (it is the slow baseline); the others take the median.
    measures = [
        _measure(spark, label, m, finals[m], actions[m])
        if m == "full_rebuild"
        else repeated_measure(
            spark, spec, label, m, finals[m], action=actions[m], fresh=partial(fresh, m)
        )
        for m in methods
    ]
    columns = [c for c in final_schema(changes.schema).fieldNames() if c not in ARRIVAL]
    identical = _check_identical(spark, label, finals, columns)
    changes.unpersist()
    shutil.rmtree(case_dir, ignore_errors=True)
    return {
        "label": label,
        "rows": rows,
        "partitions": spec.partitions,
        "touched_partitions": touched,
        "touched_fraction": fraction,
        "changes": staged.result.staged,
        "stage_seconds": stage_seconds,
        "stage_spark": stage_spark,
        "identical": identical,
        "methods": {m.method: asdict(m) for m in measures},
    }


def build_base(spark: SparkSession, spec: BenchSpec, work: Path, rows: int) -> tuple[Path, float]:
    """The base final table of `rows` rows, written and committed like final (seconds taken)."""
    table = bench_table(spec)
    path = work / f"base-{rows}" / "final"
    started = time.perf_counter()
    frame = base_rows(spark, spec, rows)
    delta.ensure_table(path, frame.schema, [table.partition_column or ""])
    snapshot = delta.load_snapshot(path)
    run_id = delta.new_run_id()
    written = delta.write_files(frame, path, snapshot.partition_columns, run_id)
    delta.commit(snapshot, written, "append", step="bench_base", run_id=run_id)
    return path, round(time.perf_counter() - started, 2)


# The ratio names of each method against overwrite-final (`<name>_over_overwrite_at_<pct>pct`).
RATIO_NAMES = {
    "full_rebuild": "rebuild",
    "delta_rs_merge": "merge",
    DELTA_RS_UNSTREAMED: "merge_unstreamed",
    "delta_spark_merge": "spark_merge",
    DELTA_SPARK_DV: "spark_merge_dv",
}


def ratios(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets of the performance issue, as ratios (reported, not asserted)."""

    def seconds(case: dict[str, Any], method: str) -> float:
        return float(case["methods"][method]["seconds"])

    out: dict[str, Any] = {}
    for case in cases:
        if case["label"].startswith("fraction"):
            pct = round(case["touched_fraction"] * 100, 2)
            ours = seconds(case, "overwrite_final")
            for method, name in RATIO_NAMES.items():
                if method in case["methods"]:
                    out[f"{name}_over_overwrite_at_{pct}pct"] = round(
                        seconds(case, method) / ours, 2
                    )
    sized = sorted((c for c in cases if c["label"].startswith("size")), key=lambda c: c["rows"])
    if len(sized) >= 2:
        small, large = sized[0], sized[-1]
        factor = large["rows"] // small["rows"]
        out[f"overwrite_x{factor}_over_x1"] = round(
            seconds(large, "overwrite_final") / seconds(small, "overwrite_final"), 2
        )
    return out


def summary_table(result: dict[str, Any]) -> list[str]:
    """The result as a Markdown table: a row per case (each once), a column per method, its
    seconds and its time over overwrite-final's."""
    methods = [m for m in METHODS if any(m in c["methods"] for c in result["cases"])]
    lines = [
        "| case | " + " | ".join(methods) + " |",
        "|---|" + "---|" * len(methods),
    ]
    seen: set[tuple[int, float]] = set()
    for case in result["cases"]:
        if (case["rows"], case["touched_fraction"]) in seen:
            continue
        seen.add((case["rows"], case["touched_fraction"]))
        ours = case["methods"]["overwrite_final"]["seconds"]
        cells = []
        for method in methods:
            if method not in case["methods"]:
                cells.append("-")
                continue
            taken = case["methods"][method]["seconds"]
            ratio = f" ({taken / ours:.2f}x)" if method != "overwrite_final" and ours else ""
            cells.append(f"{taken:.2f} s{ratio}")
        name = f"{case['rows']:,} rows, {case['touched_fraction'] * 100:g}%"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def plot(result: dict[str, Any], target: Path) -> None:
    """time vs touched fraction and time vs table size, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    fraction_cases = sorted(
        (c for c in result["cases"] if c["label"].startswith("fraction")),
        key=lambda c: c["touched_fraction"],
    )
    size_cases = sorted(
        (c for c in result["cases"] if c["label"].startswith("size")), key=lambda c: c["rows"]
    )
    for method in [m for m in METHODS if all(m in c["methods"] for c in result["cases"])]:
        left.plot(
            [c["touched_fraction"] * 100 for c in fraction_cases],
            [c["methods"][method]["seconds"] for c in fraction_cases],
            marker="o",
            label=method,
        )
        right.plot(
            [c["rows"] / 1e6 for c in size_cases],
            [c["methods"][method]["seconds"] for c in size_cases],
            marker="o",
            label=method,
        )
    spec = result["spec"]
    left.set(
        xlabel="touched partitions (%)",
        ylabel="seconds",
        title=f"{spec['rows']:,} rows, {spec['changes']:,} changes"
        + (", spread keys" if spec.get("key_layout") == "spread" else "")
        + (", partition_stable" if spec.get("partition_stable") else ""),
    )
    right.set(xlabel="table rows (millions)", ylabel="seconds", title="same change set")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.set_ylim(bottom=0)
        axis.legend()
    figure.tight_layout()
    figure.savefig(target, dpi=110)
    plt.close(figure)


def run_cases(
    spark: SparkSession, spec: BenchSpec, work: Path, log: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """The warm-up case, then every case of the sweep (fractions at x1, then sizes)."""
    # A small throwaway case first: JIT and Spark caches warm up for all methods alike.
    if spec.warm_up:
        warm = replace(spec, rows=spec.partitions * 50, changes=spec.partitions * 5)
        warm_base, _ = build_base(spark, warm, work, warm.rows)
        run_case(spark, warm, work, warm_base, warm.rows, spec.fractions[0], label="warm-up")
    bases: dict[int, tuple[Path, float]] = {}
    for size in sorted(set(spec.sizes) | {1}):
        bases[size] = build_base(spark, spec, work, spec.rows * size)
        log(f"bench: base table of {spec.rows * size:,} rows built in {bases[size][1]} s")
    plan = [(f"fraction-{f}", 1, f) for f in spec.fractions]
    plan += [(f"size-x{s}", s, spec.size_sweep_fraction) for s in spec.sizes]
    cases: list[dict[str, Any]] = []
    done: dict[tuple[int, float], dict[str, Any]] = {}
    for label, size, fraction in plan:
        if (size, fraction) in done:
            # x1 of the size sweep is the fraction case of the same fraction: not rerun.
            cases.append({**done[(size, fraction)], "label": label})
            continue
        case = run_case(spark, spec, work, bases[size][0], spec.rows * size, fraction, label=label)
        case["base_build_seconds"] = bases[size][1]
        done[(size, fraction)] = case
        cases.append(case)
        times = ", ".join(f"{m} {v['seconds']} s" for m, v in case["methods"].items())
        log(
            f"bench: {label}: {case['changes']} changes in {case['touched_partitions']} "
            f"partitions: {times}"
        )
    return cases


def peers_document(spark: SparkSession, spec: BenchSpec) -> dict[str, Any]:
    """The JSON's `peers`: the methods run and left out (why), delta-rs's settings, and whether
    the MERGEs named the touched partitions."""
    run, left_out = available_methods(spark, spec)
    return {
        "methods": run,
        "left_out": left_out,
        "delta_rs": delta_rs_settings(),
        "delta_spark_merge_dv": "delta.enableDeletionVectors=true on its copy, before the run",
        "partition_predicate": spec.partition_stable,
    }


# A measurement run after the cases in the bench's work folder: the Kafka staging rate
# (`cdc_tools.bench.kafka_stage.measure_kafka_staging`), kept in the JSON as `kafka_staging`.
KafkaMeasure = Callable[..., dict[str, Any]]


def run_bench(
    spark: SparkSession,
    spec: BenchSpec,
    log: Callable[[str], None] = print,
    *,
    kafka: KafkaMeasure | None = None,
) -> dict[str, Any]:
    """The whole sweep, then `kafka(spark, spec, work, log=log)` when given; returns the result
    written to the output folder."""
    spec.output.mkdir(parents=True, exist_ok=True)
    load_before = [round(x, 2) for x in os.getloadavg()]
    peers = peers_document(spark, spec)  # unknown methods fail here, before any case
    with tempfile.TemporaryDirectory(prefix="cdc-bench-", dir=spec.output) as tmp:
        work = Path(tmp)
        cases = run_cases(spark, spec, work, log)
        auto_cdc = auto_cdc_peer(spark, work)
        log(f"bench: Spark Declarative Pipelines AUTO CDC into Delta: {auto_cdc}")
        load_after_cases = [round(x, 2) for x in os.getloadavg()]
        kafka_staging = kafka(spark, spec, work, log=log) if kafka is not None else None
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    result = {
        "created": stamp,
        "spec": {**asdict(spec), "output": str(spec.output)},
        "machine": {
            "cpus": os.cpu_count(),
            "spark_master": spark.conf.get("spark.master"),
            "load_before": load_before,
            "load_after_cases": load_after_cases,
            "load_after": [round(x, 2) for x in os.getloadavg()],
        },
        "delta_spark": has_delta_spark(spark),
        "peers": peers,
        "auto_cdc": auto_cdc,
        "cases": cases,
        "ratios": ratios(cases),
    }
    if kafka_staging is not None:
        result["kafka_staging"] = kafka_staging
    write_result(result, spec.output, stamp)
    return result


def write_result(result: dict[str, Any], output: Path, stamp: str) -> None:
    """bench-<stamp>.json and .png in `output`, and copies as latest.json and latest.png."""
    text = json.dumps(result, indent=2, default=str)
    (output / f"bench-{stamp}.json").write_text(text)
    (output / "latest.json").write_text(text)
    plot(result, output / f"bench-{stamp}.png")
    shutil.copy(output / f"bench-{stamp}.png", output / "latest.png")
