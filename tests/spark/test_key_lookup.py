"""Overwrite-final's rows of the changed keys: picked by the keys' values where few, exactly as
a join with the keys picks them."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from cdc_pipeline.columns import quoted
from spark_jobs.overwrite import key_lookup
from spark_jobs.overwrite.key_lookup import key_set, with_keys

pytestmark = pytest.mark.spark

NAME = "a.b`c"  # a key column whose name needs quoting
CASES = {
    "bigint, int keys": (
        "bigint",
        [1, 2, None, 3, 2**40, -5],
        pa.array([2, None, 7, -5], pa.int32()),
    ),
    "bigint, bigint keys": ("bigint", [1, 2, None, 2**40], pa.array([2**40, 2**40, 1], pa.int64())),
    "string": (
        "string",
        ["", "x'y", "é", None, "a\\b", "A"],
        pa.array(["", "x'y", "a\\b", None, "a"], pa.string()),
    ),
}


def _rows(frame: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in frame.collect()), key=repr)


@pytest.mark.parametrize("many", [False, True], ids=["by value", "over KEY_SET_MAX: a join"])
@pytest.mark.parametrize("case", list(CASES))
def test_changed_keys_by_value_are_the_joins_rows(
    spark: Any, monkeypatch: pytest.MonkeyPatch, case: str, many: bool
) -> None:
    """Semi and anti: the same rows as the join with the keys, nulls (a null key matches
    nothing), duplicates, a narrower key type and quoted names included."""
    kind, values, changed = CASES[case]
    if many:
        monkeypatch.setattr(key_lookup, "KEY_SET_MAX", 1)
    column = quoted(NAME)
    frame = spark.createDataFrame([(v, n) for n, v in enumerate(values)], f"{column} {kind}, n int")
    local = pa.table({NAME: changed})
    keys_df = spark.createDataFrame([(v,) for v in changed.to_pylist()], f"{column} {kind}")
    match = key_set(local, [NAME])
    assert (match is None) == many
    for how in ("left_semi", "left_anti"):
        picked = with_keys(frame, keys_df, match, [NAME], broadcast=True, how=how)
        assert _rows(picked) == _rows(frame.join(keys_df, on=[NAME], how=how)), how


def test_only_one_integer_or_string_key_is_picked_by_value() -> None:
    """Composite keys, floating point (NaN, -0.0), unsigned, decimal and timestamp keys join."""
    assert key_set(None, ["k"]) is None
    assert key_set(pa.table({"k": [1], "j": [2]}), ["k", "j"]) is None
    for array in (
        pa.array([1.5]),
        pa.array([1], pa.uint64()),
        pa.array([1], pa.decimal128(5, 0)),
        pa.array([0], pa.timestamp("us")),
    ):
        assert key_set(pa.table({"k": array}), ["k"]) is None, array.type
