"""The bench's peers at their best (no Spark): which methods run, the partition predicate of a
partition_stable table's MERGEs, the ratios and summary table per method, and the Kafka
measurement's messages."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any

import pytest

from cdc_tools.bench import merges as bench
from cdc_tools.bench.kafka_stage import bootstrap_servers, change_messages
from cdc_tools.bench.peers import (
    delta_rs_settings,
    delta_rs_streamed_default,
    partition_condition,
    sql_literal,
)
from cdc_tools.cli import main


class Conf:
    def __init__(self, extensions: str) -> None:
        self.extensions = extensions

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.extensions if name == "spark.sql.extensions" else default


class Session:
    """Just what `available_methods` asks a session: its SQL extensions."""

    def __init__(self, extensions: str = "") -> None:
        self.conf = Conf(extensions)


DELTA = "io.delta.sql.DeltaSparkSessionExtension"


def test_every_method_runs_by_default_with_delta_spark() -> None:
    run, left_out = bench.available_methods(Session(DELTA), bench.BenchSpec())  # type: ignore[arg-type]
    assert run == list(bench.METHODS) and left_out == {}


def test_without_delta_spark_its_merges_are_left_out_and_said_why() -> None:
    run, left_out = bench.available_methods(Session(), bench.BenchSpec())  # type: ignore[arg-type]
    assert "delta_spark_merge" not in run and "delta_spark_merge_dv" not in run
    assert set(left_out) == {"delta_spark_merge", "delta_spark_merge_dv"}
    assert all("Delta Lake extension" in why for why in left_out.values())


def test_chosen_methods_always_include_overwrite_final_and_keep_their_order() -> None:
    spec = bench.BenchSpec(methods=("delta_spark_merge_dv", "delta_rs_merge"))
    run, left_out = bench.available_methods(Session(DELTA), spec)  # type: ignore[arg-type]
    assert run == ["overwrite_final", "delta_rs_merge", "delta_spark_merge_dv"]
    assert left_out == {}
    with pytest.raises(ValueError, match="unknown method"):
        bench.available_methods(Session(DELTA), replace(spec, methods=("merge_fast",)))  # type: ignore[arg-type]


def test_the_installed_deltalake_streams_its_merge_by_default() -> None:
    """deltalake 1.6's `streamed_exec` defaults to True: `delta_rs_merge` is the streamed one,
    and the variant is `streamed_exec=False` (the source's statistics prune the target)."""
    assert delta_rs_streamed_default() is True
    settings = delta_rs_settings()
    assert settings["streamed_exec_default"] is True
    assert "streamed_exec=False" in settings["delta_rs_merge_unstreamed"]


def test_a_partition_stable_merge_names_the_touched_partitions() -> None:
    stable = bench.bench_table(bench.BenchSpec(partition_stable=True))
    assert partition_condition(stable, [3, None, 0, 3]) == "t.`REGION_P` IN (0, 3) AND "
    assert partition_condition(stable, [None]) == ""  # only key-only deletes: no predicate
    assert partition_condition(stable, None) == ""
    moving = bench.bench_table(bench.BenchSpec())
    assert partition_condition(moving, [0, 3]) == ""  # a key may move: every partition


def test_partition_values_become_sql_literals() -> None:
    assert [sql_literal(v) for v in (7, 2.5, "EU", "it's", True)] == [
        "7",
        "2.5",
        "'EU'",
        "'it''s'",
        "true",
    ]


def case(label: str, fraction: float, rows: int, **seconds: float) -> dict[str, Any]:
    return {
        "label": label,
        "rows": rows,
        "touched_fraction": fraction,
        "methods": {m: {"seconds": s} for m, s in seconds.items()},
    }


CASES = [
    case(
        "fraction-0.01",
        0.01,
        100,
        overwrite_final=0.5,
        full_rebuild=10.0,
        delta_rs_merge=1.0,
        delta_rs_merge_unstreamed=0.75,
        delta_spark_merge=1.5,
        delta_spark_merge_dv=1.25,
    ),
    case("size-x1", 0.01, 100, overwrite_final=0.5, delta_rs_merge=1.0),
]


def test_every_peer_has_its_ratio_to_overwrite_final() -> None:
    assert bench.ratios(CASES) == {
        "rebuild_over_overwrite_at_1.0pct": 20.0,
        "merge_over_overwrite_at_1.0pct": 2.0,
        "merge_unstreamed_over_overwrite_at_1.0pct": 1.5,
        "spark_merge_over_overwrite_at_1.0pct": 3.0,
        "spark_merge_dv_over_overwrite_at_1.0pct": 2.5,
    }


def test_the_summary_table_shows_each_case_once_with_every_method() -> None:
    lines = bench.summary_table({"cases": CASES})
    assert lines[0] == (
        "| case | overwrite_final | full_rebuild | delta_rs_merge | delta_rs_merge_unstreamed "
        "| delta_spark_merge | delta_spark_merge_dv |"
    )
    assert lines[2] == (
        "| 100 rows, 1% | 0.50 s | 10.00 s (20.00x) | 1.00 s (2.00x) | 0.75 s (1.50x) "
        "| 1.50 s (3.00x) | 1.25 s (2.50x) |"
    )
    assert len(lines) == 3  # the size sweep's x1 is the same case


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--methods", "overwrite_final,merge_fast"], "unknown method(s) merge_fast"),
        (["--kafka-messages", "0"], "--kafka-messages must be at least 1, not 0"),
    ],
)
def test_bench_refuses_bad_method_lists_and_message_counts(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *args]) == 2
    assert message in capsys.readouterr().err


def test_kafka_messages_are_flat_json_changes_of_distinct_keys() -> None:
    spec = bench.BenchSpec(key_width=2, partitions=10)
    messages = change_messages(spec, 40)
    values = [json.loads(value) for _, value in messages]
    assert [key for key, _ in messages] == [str(v["K1"]) for v in values]
    assert len({(v["K1"], v["K2"]) for v in values}) == 40
    assert [v["FLAG"] for v in values].count("I") == 2
    deletes = [v for v in values if v["FLAG"] == "D"]
    assert len(deletes) == 2 and all(set(d) == {"K1", "K2", "FLAG", "TS"} for d in deletes)
    assert {v["TS"] for v in values} == {"2024-01-02 00:00:00"}
    table = bench.bench_table(spec, topic="cdc-bench-t")
    assert (table.source, table.topic, table.file_format) == ("kafka", "cdc-bench-t", "json")


def test_the_bootstrap_servers_are_set_for_the_measurement_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CDC_KAFKA_BOOTSTRAP_SERVERS", "elsewhere:9092")
    with bootstrap_servers("127.0.0.1:1234"):
        assert os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:1234"
    assert os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"] == "elsewhere:9092"


def test_the_results_index_names_the_new_methods_and_the_kafka_rate() -> None:
    from cdc_tools.bench import results_index

    result: dict[str, Any] = {"cases": [{**CASES[0], "changes": 20000}]}
    figures = results_index.bench_figures(result)
    assert "delta-rs MERGE (unstreamed) 0.75 s" in figures
    assert "delta-spark MERGE INTO (deletion vectors) 1.25 s" in figures
    result["kafka_staging"] = {"messages": 1000, "stage_seconds": 0.5, "messages_per_second": 2000}
    assert results_index.bench_figures(result).endswith(
        "; Kafka: 1,000 messages staged in 0.50 s, 2,000 messages/s"
    )
