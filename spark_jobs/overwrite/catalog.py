"""The tables in Spark's catalog: `<database>.<table>` (and `_history`) over the Delta folders.

Registered by overwrite-final when missing, so `spark.table("cdc.orders")` works on the same
Spark: the Connect server's session catalog (as long as the server lives), or a Hive metastore
when the deployment configures one (for good). A classic `cdc` process's catalog ends with it:
nothing is registered there. It needs
Spark's Delta connector (the jars `make install` fetches); without it, or when the catalog
refuses, the run goes on and says so: registering is a convenience, never a reason to fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cdc_pipeline.config import TableConfig
from cdc_pipeline.paths import Location, TablePaths
from spark_jobs.runtime.notices import warn
from spark_jobs.runtime.storage import store_for


def outlives_this_process(spark: Any) -> bool:
    """Whether a table registered now is there for the next query: a Connect server's session
    catalog, or a Hive metastore. A classic session's in-memory catalog ends with the `cdc`
    process, so registering there would only cost the run time."""
    from spark_jobs.runtime.session import is_connect

    if is_connect(spark):
        return True
    return str(spark.conf.get("spark.sql.catalogImplementation", "in-memory")) == "hive"


def catalog_names(table: TableConfig, paths: TablePaths) -> dict[str, Location]:
    """`database.name` -> the Delta folder it stands for."""
    names = {f"{table.database}.{table.name}": paths.final}
    if table.history:
        names[f"{table.database}.{table.name}_history"] = paths.history
    return names


def _uri(path: Location) -> str:
    """The location Spark's catalog gives a table at `path`, as `_normalised` writes it."""
    if isinstance(path, Path):
        return path.resolve().as_uri().rstrip("/")
    return str(path)


def _normalised(location: str) -> str:
    """A catalog location as `_uri` gives one: a file URI, s3://, no trailing slash."""
    if location.startswith("file:") and not location.startswith("file://"):
        location = "file://" + location[len("file:") :]
    if location.startswith("s3a://"):
        location = "s3://" + location[len("s3a://") :]
    return location.rstrip("/")


def _registered_location(spark: Any, database: str, short: str) -> str | None:
    """Where `database.short` is registered: "" when it is not; None when it is with no
    location (registered again).

    From the catalog's own entry (`SHOW TABLE EXTENDED`): it reads no Delta log, where
    `DESCRIBE DETAIL` first brings Spark's copy of the table's state up to the version the run
    just committed (Spark jobs on every run), and where `tableExists` loads the table (and fails
    when its folder is gone). Names and databases are lower-case letters, digits and _ (config),
    so the pattern matches only the name.
    """
    query = f"SHOW TABLE EXTENDED IN `{database}` LIKE '{short}'"
    for row in command_rows(spark.sql(query)):
        if str(row["tableName"]).lower() != short or row["isTemporary"]:
            continue
        for line in str(row["information"]).splitlines():
            if line.startswith("Location: "):
                return _normalised(line[len("Location: ") :].strip())
        return None
    return ""


def command_rows(result: Any) -> list[dict[str, Any]]:
    """The rows of a SQL command's result (`spark.sql` of a SHOW): a Connect server sends them
    with the command's response, which a `collect()` would send back to the server to run
    again (a request of its own, about 20 ms of the server's CPU); classic collects them."""
    relation: Any = getattr(getattr(result, "_plan", None), "_plan", None)
    local = getattr(relation, "local_relation", None)
    if local is not None and relation.HasField("local_relation") and local.HasField("data"):
        import pyarrow as pa

        return pa.ipc.open_stream(local.data).read_all().to_pylist()
    return [row.asDict() for row in result.collect()]  # metadata: the command's few rows


def register_tables(spark: Any, table: TableConfig, paths: TablePaths) -> list[str]:
    """Register the table's final (and history) table where it is missing; the names added.

    A run whose tables are registered already asks the catalog one question per table; the
    database is created when that question fails (however the catalog says it has no such
    database), then asked again."""
    added: list[str] = []
    try:
        for name, path in catalog_names(table, paths).items():
            log = store_for(path).info(path / "_delta_log")
            if log is None or not log.is_dir:
                continue
            database, short = name.split(".")
            quoted = f"`{database}`.`{short}`"
            try:
                registered = _registered_location(spark, database, short)
            except Exception:
                spark.sql(f"CREATE DATABASE IF NOT EXISTS `{database}`")
                registered = _registered_location(spark, database, short)
            if registered == _uri(path):
                continue
            if registered != "":
                # Another warehouse's, or one whose folder is gone: an external table.
                spark.sql(f"DROP TABLE {quoted}")
            location = str(path).replace("'", "\\'")
            spark.sql(f"CREATE TABLE {quoted} USING delta LOCATION '{location}'")
            added.append(name)
    except Exception as error:  # the catalog is a convenience: the run's commits stand
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        warn(
            f"table {table.name}: not registered in the Spark catalog as "
            f"{table.database}.{table.name}: {text}"
        )
    return added
