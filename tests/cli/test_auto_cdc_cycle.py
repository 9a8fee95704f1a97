"""The AUTO CDC peer of the cycle benchmark (`python -m cdc_tools.bench.auto_cdc`): Spark's own
Declarative Pipelines AUTO CDC flows, on a real Connect server with Spark's in-memory row-level
test table as their target, give every table exactly the rows its change sets give (computed in
Python by bench_cycle's expectation), and the check says so when a target differs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cdc_airflow.local import connect_server
from cdc_tools.bench import auto_cdc as auto_cdc_cycle
from cdc_tools.bench.auto_cdc import AutoCdcCycleError

pytestmark = [pytest.mark.cli, pytest.mark.slow]


@pytest.fixture(scope="module")
def auto_cdc_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Connect server with the in-memory catalog for this module's tests (a 4g JVM each
    cost about a minute more)."""
    log = tmp_path_factory.mktemp("auto-cdc-server") / "server.log"
    server = connect_server.start(
        master="local[2]", conf=auto_cdc_cycle.server_conf(), log_path=log
    )
    try:
        yield server
    finally:
        server.stop()


def test_auto_cdc_flows_apply_the_cycle_change_sets_exactly(
    auto_cdc_server: Any, tmp_path: Path
) -> None:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    spark: Any = ConnectSession.builder.remote(auto_cdc_server.url).create()
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {auto_cdc_cycle.CATALOG}.{auto_cdc_cycle.DATABASE}")
    auto_cdc_cycle.drop_targets(spark, 3, "t_")
    # Three tables, one of each kind: upserts with moves, key-only deletes and re-inserts
    # (partitioned, unpartitioned) and insert-only events with exact duplicates; two runs.
    figures = auto_cdc_cycle.measure(spark, 3, 40, tmp_path / "work", warm=False)
    assert figures["exact_targets"] == 3
    assert figures["first_run_seconds"] > 0 and figures["incremental_run_seconds"] > 0
    # Each table's expectation holds deletes and updates of the first round's keys.
    first = auto_cdc_cycle.generate_table(0, 40, auto_cdc_cycle.HOUR, auto_cdc_cycle.SEED)
    later = auto_cdc_cycle.later_round(first, 40, auto_cdc_cycle.SEED + auto_cdc_cycle.LATER)
    both = auto_cdc_cycle.combined(first, later)
    assert {r["FLAG"] for r in both.rows} == {"I", "U", "D"}
    assert auto_cdc_cycle.check_targets(spark, [both], "t_") == 1
    # A target compared with what it does not hold fails the run, naming it.
    latest = max(both.rows, key=lambda r: r["SEQ"])  # the latest change of its key
    wrong = replace(both, rows=tuple(r for r in both.rows if r is not latest))
    with pytest.raises(AutoCdcCycleError, match="target t_bc000_p"):
        auto_cdc_cycle.check_targets(spark, [wrong], "t_")
    spark.stop()


def test_the_command_writes_its_figures(auto_cdc_server: Any, tmp_path: Path) -> None:
    output = tmp_path / "out"
    # On the module's server (--remote), whose catalog holds the other test's targets: the
    # command drops its own before it runs, so only its change sets can make them exact.
    argv = ["--tables", "2", "--changes", "20", "--no-warm-up", "--output", str(output)]
    assert auto_cdc_cycle.main([*argv, "--remote", auto_cdc_server.url]) == 0
    result = json.loads((output / "latest.json").read_text())
    assert result["exact_targets"] == 2
    assert result["load_before"]["cpus"] and result["spark"] == "4.2.0"
    assert result["server"] == f"the Connect server at {auto_cdc_server.url}"
