"""An independent reference of the latest-change rule: plain Python over the landed files."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq


def landed_changes(table_dir: Path) -> list[dict[str, Any]]:
    """Every landed row with its arrival (hour folder, file name, row position)."""
    rows = []
    for path in sorted(table_dir.glob("dt=*/hr=*/*")):
        if path.name.startswith((".", "_")):
            continue
        batch = f"{path.parent.parent.name[3:]}T{path.parent.name[3:]}"
        if path.suffix == ".parquet":
            records = pq.read_table(path).to_pylist()
        elif path.suffix == ".csv":
            with path.open() as handle:
                records = [
                    {k: (v if v != "" else None) for k, v in r.items()}
                    for r in csv.DictReader(handle)
                ]
        else:
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for position, record in enumerate(records):
            rows.append({**record, "_arrival": (batch, path.name, position)})
    return rows


def latest_state(
    changes: Iterable[dict[str, Any]],
    keys: list[str],
    sequence: Callable[[dict[str, Any]], tuple[Any, ...]],
    flag: str = "FLAG",
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """key -> latest row by (sequence, arrival); keys whose latest change is D are absent."""
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for change in changes:
        key = tuple(change[k] for k in keys)
        rank = (sequence(change), change["_arrival"])
        if key not in latest or rank > (sequence(latest[key]), latest[key]["_arrival"]):
            latest[key] = change
    return {key: change for key, change in latest.items() if change[flag] != "D"}
