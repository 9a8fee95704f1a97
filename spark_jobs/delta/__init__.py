"""The Delta adapter: Spark writes Parquet files, delta-rs commits them; snapshot reads for Spark.

Spark cannot load a Delta connector here, so the transaction log is delta-rs's: a step reads one
snapshot (the files of one table version), lets Spark compute and write new Parquet files, and
then commits add and remove actions (files removed by name, or whole partitions by partition
filter) in one atomic delta-rs commit made from that same snapshot, so delta-rs sees the
concurrent commits it must check against.

By concern: `reading` (snapshots and their rows), `writing` (Parquet files into a table folder,
with footer statistics), `committing` (the commit, finding it in the log, and `with_retries`:
the one retry/back-off policy and its limit), `evolution` (schema changes), `lease` (one
maintenance step of a table at a time), `faults` (test hooks).
The names below are the adapter's interface; steps use them as `delta.<name>`.
"""

from spark_jobs.delta.committing import (
    MAX_COMMIT_ATTEMPTS,
    RUN_ID_KEY,
    STEP_KEY,
    CommitResult,
    append_arrow,
    append_with_retries,
    commit,
    data_commits_between,
    find_commit,
    new_run_id,
    remove_duplicate_rows,
    retry_delay,
    sleep_before_retry,
    try_commit,
    with_retries,
)
from spark_jobs.delta.evolution import evolve_table, evolved_schema
from spark_jobs.delta.faults import inject_fault
from spark_jobs.delta.lease import holding as holding_lease
from spark_jobs.delta.reading import (
    FILE_NAME_COLUMN,
    TABLE_PROPERTIES,
    DataFile,
    Snapshot,
    arrow_and_schema,
    arrow_table,
    arrow_table_rows,
    canonical_partition_value,
    ensure_table,
    finished,
    load_snapshot,
    local_frame,
    open_table,
    partition_value_string,
    partition_values_of,
    read_snapshot,
    reusing_tables,
    spark_schema_of,
    with_known_schema,
)
from spark_jobs.delta.writing import (
    ROUTE_COLUMN,
    TMP_DIR,
    WrittenFiles,
    footer_stats,
    plain_columns,
    write_files,
    write_routed,
)

__all__ = [
    "FILE_NAME_COLUMN",
    "MAX_COMMIT_ATTEMPTS",
    "ROUTE_COLUMN",
    "RUN_ID_KEY",
    "STEP_KEY",
    "TABLE_PROPERTIES",
    "TMP_DIR",
    "CommitResult",
    "DataFile",
    "Snapshot",
    "WrittenFiles",
    "append_arrow",
    "append_with_retries",
    "arrow_and_schema",
    "arrow_table",
    "arrow_table_rows",
    "canonical_partition_value",
    "commit",
    "data_commits_between",
    "ensure_table",
    "evolve_table",
    "evolved_schema",
    "find_commit",
    "finished",
    "footer_stats",
    "holding_lease",
    "inject_fault",
    "load_snapshot",
    "local_frame",
    "new_run_id",
    "open_table",
    "partition_value_string",
    "partition_values_of",
    "plain_columns",
    "read_snapshot",
    "remove_duplicate_rows",
    "retry_delay",
    "reusing_tables",
    "sleep_before_retry",
    "spark_schema_of",
    "try_commit",
    "with_known_schema",
    "with_retries",
    "write_files",
    "write_routed",
]
