"""`cdc bench`'s peers at their best on a tiny case: on a partition_stable table both MERGEs
name the touched partitions and still agree with overwrite-final row for row, deletion vectors
included (read by delta-spark's reader)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cdc_tools.bench import merges as bench
from spark_jobs.runtime.session import project_jars

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not project_jars(), reason="Delta jars not fetched: run make install"),
]


def test_partition_stable_merges_with_the_partition_predicate_agree_with_overwrite_final(
    spark: Any, tmp_path: Path
) -> None:
    spec = replace(
        bench.BenchSpec.smoke(tmp_path),
        partition_stable=True,
        repeats=1,
        warm_up_runs=0,
        methods=("delta_rs_merge", "delta_rs_merge_unstreamed", "delta_spark_merge_dv"),
    )
    base, _ = bench.build_base(spark, spec, tmp_path, spec.rows)

    # Fails naming the method when a MERGE's rows differ from overwrite-final's.
    case = bench.run_case(spark, spec, tmp_path, base, spec.rows, 0.2, label="stable")

    assert case["identical"] and case["touched_partitions"] == 2
    assert list(case["methods"]) == [
        "overwrite_final",
        "delta_rs_merge",
        "delta_rs_merge_unstreamed",
        "delta_spark_merge_dv",
    ]
    dv = case["methods"]["delta_spark_merge_dv"]
    assert dv["counts"]["num_deleted_rows"] == 10  # 200 changes, 1 in 20 a key-only delete
    # Only the two touched partitions' files were rewritten, or given deletion vectors.
    assert 0 < dv["files_written"] <= 2 * 2


def test_the_rows_fingerprint_sees_the_rows_as_a_multiset(spark: Any) -> None:
    columns = "ID long, A string, B string, V double"
    rows = [(1, "x", None, 1.5), (2, None, "y", None), (2, None, "y", None), (3, "", "", 0.0)]

    def fingerprint(data: list[tuple[Any, ...]], parts: int = 1) -> tuple[Any, ...]:
        return bench.rows_fingerprint(spark.createDataFrame(data, columns).repartition(parts))

    same = fingerprint(rows)
    assert fingerprint(list(reversed(rows)), parts=3) == same  # any order, any files
    changed = [
        [*rows[:3], (3, "", "", 1e-300)],  # one value, by a hair
        [*rows[:2], (1, "x", None, 1.5), *rows[3:]],  # another row duplicated instead
        rows[:3],  # a duplicate gone
        [(1, None, "x", 1.5), *rows[1:]],  # a value moved to the next, null, column
        [(1, "x", "", 1.5), *rows[1:]],  # null against empty
    ]
    assert all(fingerprint(data) != same for data in changed)
