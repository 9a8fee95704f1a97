"""Delta file statistics from Parquet footers: what the moved-key lookup prunes files with."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spark_jobs.delta import footer_stats


def test_min_max_and_null_counts_over_row_groups(tmp_path: Path) -> None:
    table = pa.table(
        {
            "ID": [30, 10, None, 20],
            "NAME": ["b", None, "a", "c"],
            "DAY": [date(2024, 1, 2), date(2023, 5, 1), None, None],
            "ALL_NULL": pa.array([None, None, None, None], pa.int64()),
            "TS": pa.array([datetime(2024, 1, 1, tzinfo=UTC)] * 4, pa.timestamp("us", tz="UTC")),
            "AMOUNT": [1.5, 2.5, 3.5, 4.5],
        }
    )
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, row_group_size=2)
    stats = footer_stats(pq.read_metadata(path))
    # Timestamps and doubles are not recorded (only integer, string and date ranges are).
    assert stats == {
        "minValues": {"ID": 10, "NAME": "a", "DAY": "2023-05-01"},
        "maxValues": {"ID": 30, "NAME": "c", "DAY": "2024-01-02"},
        "nullCount": {"ID": 1, "NAME": 1, "DAY": 2, "ALL_NULL": 4},
    }
