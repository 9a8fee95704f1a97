"""Test helpers: write landing files, configure tables, read Delta tables back with deltalake."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from deltalake import DeltaTable

from cdc_pipeline.config import TableConfig, parse_config
from cdc_pipeline.intervals import HourBatch, Interval, parse_timestamp
from cdc_pipeline.paths import Location, ObjectPath, TablePaths
from spark_jobs.runtime.storage import store_for

SEED_002_COLUMNS = {"ID": "bigint", "VALUE": "int", "CDC_TIMESTAMP": "timestamp"}


@dataclass
class Workspace:
    """A test's own config file, landing zone and warehouse (in object storage when
    `objects` is set: `{objects}/landing` and `{objects}/warehouse`)."""

    root: Path
    objects: ObjectPath | None = None

    @property
    def landing(self) -> Location:
        return (self.objects or self.root) / "landing"

    @property
    def warehouse(self) -> Location:
        return (self.objects or self.root) / "warehouse"

    @property
    def config_path(self) -> Path:
        return self.root / "tables.yaml"

    def configure(self, *rows: dict[str, Any]) -> dict[str, TableConfig]:
        """Write the config table with these rows and return the validated rows."""
        document = {"tables": list(rows)}
        self.config_path.write_text(yaml.safe_dump(document, sort_keys=False))
        result = parse_config(document)
        assert not result.problems, [str(p) for p in result.problems]
        return result.tables

    def paths(self, table: str) -> TablePaths:
        return TablePaths(table, self.landing, self.warehouse)

    def land(
        self,
        table: str,
        hour: str,
        name: str,
        rows: list[dict[str, Any]],
        file_format: str = "csv",
        columns: list[str] | None = None,
    ) -> Location:
        """Write one change file into the hour folder of `hour` (e.g. '2024-01-01T05')."""
        when = parse_timestamp(hour + ":00:00Z" if len(hour) == 13 else hour)
        path = self.landing / table / HourBatch(when).folder / name
        names = columns or list(dict.fromkeys(k for r in rows for k in r))
        if file_format == "csv":
            text = io.StringIO(newline="")
            writer = csv.writer(text)
            writer.writerow(names)
            for row in rows:
                writer.writerow(["" if row.get(c) is None else row.get(c) for c in names])
            data = text.getvalue().encode()
        elif file_format == "json":
            data = "".join(
                json.dumps({k: v for k, v in r.items() if v is not None}) + "\n" for r in rows
            ).encode()
        else:
            buffer = io.BytesIO()
            pq.write_table(pa.Table.from_pylist(rows), buffer)
            data = buffer.getvalue()
        if isinstance(path, Path):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        else:
            store_for(path).write_bytes(path, data)
        return path


def interval(start: str, end: str) -> Interval:
    """Interval from short strings like '2024-01-01T05' (hour) or full ISO timestamps."""

    def full(text: str) -> str:
        return text + ":00:00Z" if len(text) == 13 else text

    return Interval.parse(full(start), full(end))


def table_rows(path: Location, columns: list[str] | None = None) -> list[tuple[Any, ...]]:
    """A Delta table's rows read with deltalake (not Spark), sorted, as tuples of `columns`."""
    table = DeltaTable(str(path)).to_pyarrow_table()
    names = columns or [c for c in table.column_names if not c.startswith("_cdc_")]
    return sorted((tuple(r[c] for c in names) for r in table.to_pylist()), key=repr)


def exists(location: Location) -> bool:
    """A file or folder at `location` (local or in object storage)."""
    return store_for(location).info(location) is not None


def files_under(location: Location) -> set[str]:
    """Every file under the folder, as paths relative to it (local or in object storage)."""
    prefix = f"{location}/"
    return {str(e.location).removeprefix(prefix) for e in store_for(location).walk(location)}


def file_paths(path: Location) -> set[str]:
    """The data files of a Delta table's current version."""
    return set(
        pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).column("path").to_pylist()
    )


def files_by_partition(path: Location, column: str) -> dict[Any, set[str]]:
    """Current data files grouped by partition value."""
    actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).to_pylist()
    grouped: dict[Any, set[str]] = {}
    for action in actions:
        grouped.setdefault(action[f"partition.{column}"], set()).add(action["path"])
    return grouped


def ts(text: str) -> datetime:
    """A UTC timestamp as deltalake returns it."""
    return parse_timestamp(text)


def stop_process_group(process: subprocess.Popen[Any], timeout: float = 60) -> None:
    """Stop a server the tests started in its own process group, by its pid: SIGTERM, then
    SIGKILL when it has not exited within `timeout` seconds."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
