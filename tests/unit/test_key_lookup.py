"""The driver-side key-range check of the moved-key lookup: which files may hold a key."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from spark_jobs.delta import DataFile
from spark_jobs.overwrite.key_lookup import files_in_key_ranges


def file(name: str, low: dict[str, Any], high: dict[str, Any]) -> DataFile:
    return DataFile(name, 1, {}, 1, low, high)


def names(files: list[DataFile]) -> list[str]:
    return [f.path for f in files]


def test_a_file_is_kept_when_one_key_lies_inside_its_range_in_every_column() -> None:
    keys = pa.table({"A": pa.array([5, 50], pa.int64()), "B": ["m", "z"]})
    files = [
        file("inside", {"A": 1, "B": "a"}, {"A": 9, "B": "n"}),  # (5, "m")
        file("second-key", {"A": 50, "B": "z"}, {"A": 50, "B": "z"}),  # bounds are inclusive
        file("columns-apart", {"A": 1, "B": "y"}, {"A": 9, "B": "zz"}),  # A fits 5, B fits "z"
        file("above", {"A": 51, "B": "a"}, {"A": 99, "B": "z"}),
        file("no-stats-for-B", {"A": 1000}, {"A": 2000}),  # unknown: must be read
        file("stat-of-another-type", {"A": "x", "B": "a"}, {"A": "y", "B": "z"}),
    ]
    assert names(files_in_key_ranges(files, keys)) == [
        "inside",
        "second-key",
        "no-stats-for-B",
        "stat-of-another-type",
    ]


def test_no_keys_keep_no_file_and_floating_keys_keep_every_file() -> None:
    files = [file("f", {"A": 1}, {"A": 2})]
    assert files_in_key_ranges(files, pa.table({"A": pa.array([], pa.int64())})) == []
    assert names(files_in_key_ranges(files, pa.table({"A": [float("nan")]}))) == ["f"]
