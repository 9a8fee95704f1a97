"""bench-cycle's pure parts: change sets, the independent expectation, the table check, the
run/task figures and the progress printer (no Airflow, no Spark)."""

from __future__ import annotations

import io
import json
import sqlite3
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from cdc_airflow.local.runs import (
    MetadataDB,
    RunRow,
    TaskRow,
    count_states,
    progress_line,
    wait_for_dag_runs,
)
from cdc_pipeline.config import load_table_configs
from cdc_tools.bench.cycle import (
    BenchCycleError,
    BenchTable,
    CycleSpec,
    check_table,
    cycle_figures,
    execute_seconds,
    expected_rows,
    generate_table,
    hour_guard,
    kafka_vs_files,
    server_warm_up,
    speedups,
    steady_figures,
    summarize_tasks,
    task_log,
    write_config,
    write_landing,
)

HOUR = datetime(2024, 1, 1, 5, tzinfo=UTC)


def upsert(flag: str, key: int, seq: int, region: str | None = "north") -> dict:
    if region is None:  # key-only delete
        return {"FLAG": flag, "ID": key, "SEQ": seq}
    return {
        "FLAG": flag,
        "ID": key,
        "NAME": f"n{key}-{seq}",
        "QTY": seq,
        "REGION": region,
        "SEQ": seq,
    }


def test_expected_rows_keep_the_latest_change_per_key_by_seq_and_drop_deletes() -> None:
    rows = (
        upsert("U", 1, 3, "east"),  # latest of key 1, although listed first
        upsert("I", 1, 1),
        upsert("D", 1, 2, None),  # an older delete loses
        upsert("I", 2, 4),
        upsert("D", 2, 5, None),  # latest of key 2: gone
        upsert("I", 3, 7, "west"),  # re-insert after a delete
        upsert("D", 3, 6),
    )
    partitioned = BenchTable(0, "partitioned", rows)
    assert expected_rows(partitioned) == [
        (1, "n1-3", 3, "east", 3, "EAST"),
        (3, "n3-7", 7, "west", 7, "WEST"),
    ]
    assert expected_rows(BenchTable(1, "unpartitioned", rows)) == [
        (1, "n1-3", 3, "east", 3),
        (3, "n3-7", 7, "west", 7),
    ]


def test_expected_rows_of_insert_only_keep_each_key_and_sequence_once() -> None:
    event = {"FLAG": "I", "ID": 1, "NAME": "e", "QTY": 2, "TS": HOUR, "SEQ": 1}
    later = {**event, "SEQ": 2, "TS": HOUR + timedelta(seconds=5)}
    table = BenchTable(2, "insert_only", (event, dict(event), later))
    naive = HOUR.replace(tzinfo=None)
    assert expected_rows(table) == [
        (1, "e", 2, naive, 1, date(2024, 1, 1)),
        (1, "e", 2, naive + timedelta(seconds=5), 2, date(2024, 1, 1)),
    ]


def test_generated_tables_rotate_kinds_and_are_reproducible() -> None:
    tables = [generate_table(i, 300, HOUR, seed=1) for i in range(4)]
    assert [t.kind for t in tables] == [
        "partitioned",
        "unpartitioned",
        "insert_only",
        "partitioned",
    ]
    assert [t.name for t in tables] == ["bc000_p", "bc001_u", "bc002_i", "bc003_p"]
    assert all(len(t.rows) == 300 for t in tables)
    assert generate_table(0, 300, HOUR, seed=1) == tables[0]
    assert generate_table(0, 300, HOUR, seed=2) != tables[0]
    flags = {r["FLAG"] for r in tables[0].rows}
    assert flags == {"I", "U", "D"}
    assert len({r["SEQ"] for r in tables[0].rows}) == 300  # no ties: the expectation is exact
    assert any(set(r) == {"FLAG", "ID", "SEQ"} for r in tables[0].rows)  # key-only deletes
    # The rows are not in sequence order (the check would not see a position-based winner).
    assert [r["SEQ"] for r in tables[0].rows] != sorted(r["SEQ"] for r in tables[0].rows)


def test_landing_files_hold_the_change_set_in_the_hour_folder(tmp_path: Path) -> None:
    table = generate_table(0, 20, HOUR, seed=3)
    path = write_landing(table, tmp_path, HOUR)
    assert path == tmp_path / "bc000_p" / "dt=2024-01-01" / "hr=05" / "part-00000.parquet"
    read = pq.ParquetFile(path).read().to_pylist()
    assert [{k: v for k, v in r.items() if v is not None} for r in read] == list(table.rows)
    events = generate_table(2, 20, HOUR, seed=3)
    text = write_landing(events, tmp_path, HOUR).read_text().splitlines()
    assert text[0] == "FLAG,ID,NAME,QTY,TS,SEQ"
    assert len(text) == 21
    keyonly = BenchTable(1, "unpartitioned", (upsert("D", 4, 9, None),))
    line = write_landing(keyonly, tmp_path, HOUR).read_text()
    assert json.loads(line) == {"FLAG": "D", "ID": 4, "SEQ": 9}


def test_check_table_passes_an_exact_final_table_and_names_a_wrong_one(tmp_path: Path) -> None:
    table = generate_table(0, 40, HOUR, seed=5)
    rows = expected_rows(table)
    columns = table.final_columns
    final = tmp_path / table.name / "final"

    def write(values: list[tuple]) -> None:
        data = {c: [v[i] for v in values] for i, c in enumerate(columns)}
        write_deltalake(str(final), pa.table(data), mode="overwrite")

    write(rows)
    assert check_table(table, tmp_path) is None
    write(rows[1:])
    problem = check_table(table, tmp_path)
    assert problem is not None
    assert problem.startswith(
        f"{table.name}: {len(rows) - 1} rows, expected {len(rows)}; missing 1"
    )
    assert "final table unreadable" in str(check_table(generate_table(3, 5, HOUR, 5), tmp_path))


def task(dag: str, task_id: str, start: float, end: float, state: str = "success") -> TaskRow:
    return TaskRow(
        dag,
        "r",
        task_id,
        state,
        1,
        HOUR,
        HOUR + timedelta(seconds=start),
        HOUR + timedelta(seconds=end),
    )


def test_cycle_figures_span_first_start_to_last_end() -> None:
    tasks = [
        task("cdc_a", "stage", 10, 30),
        task("cdc_a", "overwrite_final", 31, 61),
        task("cdc_b", "stage", 12, 20),
        task("cdc_b", "overwrite_final", 21, 90),
        task("cdc_b", "vacuum", 91, 94, "skipped"),
    ]
    runs = [
        RunRow("cdc_a", "r", "scheduled", "success", HOUR, HOUR, HOUR + timedelta(seconds=62)),
        RunRow("cdc_b", "r", "scheduled", "success", HOUR, HOUR, HOUR + timedelta(seconds=95)),
    ]
    figures, gantt = cycle_figures(tasks, runs, tables=2)
    assert figures["cycle_seconds"] == 84.0
    assert figures["per_table_run_seconds"] == 42.0
    assert figures["run_seconds_median"] == 78.5
    assert gantt[0] == {
        "dag_id": "cdc_a",
        "task_id": "stage",
        "state": "success",
        "start_s": 0.0,
        "end_s": 20.0,
    }
    summary = summarize_tasks(tasks)
    assert list(summary) == ["stage", "overwrite_final", "vacuum"]
    assert summary["overwrite_final"]["median_s"] == 49.5
    assert summary["stage"]["queue_wait_median_s"] == 11.0
    assert summary["vacuum"]["states"] == {"skipped": 1}


def test_progress_line_counts_runs_over_every_dag() -> None:
    runs = [
        RunRow("cdc_a", "1", "scheduled", "success", None, None, None),
        RunRow("cdc_b", "1", "scheduled", "running", None, None, None),
        RunRow("cdc_c", "1", "scheduled", "queued", None, None, None),
        RunRow("cdc_d", "1", "scheduled", "failed", None, None, None),
    ]
    counts = count_states(runs, ["cdc_a", "cdc_b", "cdc_c", "cdc_d", "cdc_e"])
    assert progress_line("x", counts, 5, 12.3) == (
        "x: 1/5 runs done, 1 running, 1 queued, 1 failed, 12 s"
    )


def test_wait_for_dag_runs_reads_the_metadata_db_and_prints_progress(tmp_path: Path) -> None:
    path = tmp_path / "airflow.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE dag_run (dag_id, run_id, run_type, state, data_interval_start, "
            "start_date, end_date)"
        )
        db.executemany(
            "INSERT INTO dag_run VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                ("cdc_a", "s1", "scheduled", "success", "2024-01-01 05:00:00.000000", None, None),
                ("cdc_b", "s1", "scheduled", "failed", "2024-01-01 05:00:00+00:00", None, None),
                ("cdc_b", "s2", "scheduled", "running", "2024-01-01 06:00:00", None, None),
            ],
        )
    out = io.StringIO()
    runs = wait_for_dag_runs(
        MetadataDB(path),
        ["cdc_a", "cdc_b"],
        1,
        select=lambda r: r.interval_start == HOUR,
        label="t",
        timeout=5,
        per_table=True,
        out=out,
    )
    assert sorted((r.dag_id, r.state) for r in runs) == [("cdc_a", "success"), ("cdc_b", "failed")]
    assert out.getvalue().splitlines() == [
        "t: 1/2 runs done, 0 running, 0 queued, 1 failed, 0 s",
        "  cdc_a: 1/1 done, 0 running, 0 queued, 0 failed",
        "  cdc_b: 0/1 done, 0 running, 0 queued, 1 failed",
    ]


def test_cycle_spec_rejects_bad_options() -> None:
    for spec, text in (
        (CycleSpec(tables=0), "--tables must be at least 1, not 0"),
        (CycleSpec(changes=1), "--changes must be at least 2, not 1"),
        (CycleSpec(parallelism=0), "--parallelism must be at least 1, not 0"),
        (CycleSpec(every=7), "--every must be one of 5, 10, 15, 30, 60 (minutes), not 7"),
    ):
        try:
            spec.validate()
        except ValueError as error:
            assert str(error) == text
        else:
            raise AssertionError(f"{spec} was accepted")


def test_execute_seconds_span_pre_execute_end_to_the_summary_line(tmp_path: Path) -> None:
    row = task("cdc_a", "stage", 0, 60)
    log = task_log(tmp_path, row)
    assert execute_seconds(log) is None  # no log
    log.parent.mkdir(parents=True)
    events = [
        ("2024-01-01T05:00:00.000000Z", "::group::Pre Execute"),
        ("2024-01-01T05:00:04.500000Z", "::endgroup::"),
        ("2024-01-01T05:00:30.000000Z", "stage bc000_p: files=1"),
        ("2024-01-01T05:00:44.750000Z", "CDC summary: stage bc000_p: files=1"),
        ("2024-01-01T05:00:45.000000Z", "::endgroup::"),
    ]
    log.write_text("".join(json.dumps({"timestamp": t, "event": e}) + "\n" for t, e in events))
    assert log == tmp_path / "dag_id=cdc_a" / "run_id=r" / "task_id=stage" / "attempt=1.log"
    assert execute_seconds(log) == 40.25
    summary = summarize_tasks([row], {("cdc_a", "stage"): 40.25})
    assert summary["stage"]["execute_median_s"] == 40.25
    assert summary["stage"]["outside_execute_median_s"] == 19.75


class _Pauses:
    """A stand-in for the bench's Airflow client and metadata DB: records pauses, no other runs."""

    def __init__(self) -> None:
        self.paused: list[str] = []
        self.others: list[RunRow] = []

    def pause(self, dag_id: str) -> None:
        self.paused.append(dag_id)

    def runs(self, dag_ids: list[str]) -> list[RunRow]:
        return self.others


def test_the_hour_guard_pauses_finished_dags_only_near_the_next_due_run() -> None:
    """No pause PATCH while the next interval's run is far off (a pause while tasks run can
    stall SQLite for 60 s); from `lead` seconds before it is due, each finished DAG once."""
    fake = _Pauses()
    clock = [HOUR + timedelta(hours=1, minutes=3)]
    guard = hour_guard(fake, fake, ["a", "b"], HOUR, every=60, lead=45, now=lambda: clock[0])  # type: ignore[arg-type]
    runs = [
        RunRow("a", "r1", "scheduled", "success", HOUR, None, None),
        RunRow("b", "r2", "scheduled", "running", HOUR, None, None),
    ]
    guard(runs)
    assert fake.paused == []
    clock[0] = HOUR + timedelta(hours=2) - timedelta(seconds=40)
    guard(runs)
    guard(runs)
    assert fake.paused == ["a"]
    guard([runs[0], RunRow("b", "r2", "scheduled", "failed", HOUR, None, None)])
    assert fake.paused == ["a", "b"]


def test_kafka_config_rows_read_a_topic_each_and_pass_the_config_check(tmp_path: Path) -> None:
    tables = [BenchTable.without_rows(i) for i in range(3)]  # one of each kind
    config = tmp_path / "tables.yaml"
    spec = CycleSpec(tables=3, sources=("kafka",), kafka_conn_id="kafka_bench", every=15)
    write_config(spec, "kafka", tables, config, "kafka-connect")
    result = load_table_configs(config)
    assert result.problems == []
    for table in tables:
        row = result.tables[table.name]
        assert (row.source, row.topic, row.kafka_conn_id, row.change_format) == (
            "kafka",
            f"cdc_bc.kafka-connect.{table.name}",
            "kafka_bench",
            "flat",
        )
        # Everything else as the file table's row: the same DAG, the same final table.
        files_row = table.config_row("spark_default", spec.schedule)
        kafka_row = table.kafka_config_row(
            "spark_default", spec.schedule, table.topic("kafka-connect"), "kafka_bench"
        )
        assert {k: v for k, v in files_row.items() if k != "file_format"} == {
            k: v for k, v in kafka_row.items() if k in files_row
        }
    write_config(spec, "files", tables, config, "files-connect")
    files = load_table_configs(config)
    assert files.problems == []
    assert {t.source for t in files.tables.values()} == {"files"}


def test_kafka_messages_are_the_change_set_as_flat_json_keyed_by_id() -> None:
    for index in range(3):  # one of each kind
        table = generate_table(index, 40, HOUR, seed=4)
        messages = table.messages()
        assert [key for key, _ in messages] == [str(r["ID"]) for r in table.rows]
        values = [json.loads(value) for _, value in messages]
        if table.kind != "insert_only":
            assert values == list(table.rows)  # key-only deletes stay key-only
            continue
        # Timestamps as naive UTC text, as the landed CSV holds them.
        assert values == [
            {**r, "TS": r["TS"].replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S")}
            for r in table.rows
        ]
        assert values[0]["TS"].startswith("2024-01-01 05:")


def test_a_bench_of_both_sources_reports_them_side_by_side_per_mode() -> None:
    def result(mode: str, source: str, cycle: float, exact: int = 4) -> dict:
        return {
            "mode": mode,
            "source": source,
            "tables": 4,
            "cycle_seconds": cycle,
            "per_table_run_seconds": cycle / 4,
            "tables_checked": 4,
            "tables_exact": exact,
        }

    results = [
        result("connect", "files", 40.0),
        result("connect", "kafka", 30.0),
        result("spark-submit", "files", 80.0),
        result("spark-submit", "kafka", 100.0, exact=3),
    ]
    comparison = kafka_vs_files(results)
    assert comparison["connect"] == {
        "tables": 4,
        "files_cycle_seconds": 40.0,
        "kafka_cycle_seconds": 30.0,
        "files_per_table_run_seconds": 10.0,
        "kafka_per_table_run_seconds": 7.5,
        "kafka_over_files_cycle": 0.75,
        "kafka_within_files_time": True,
        "both_exact": True,
    }
    assert comparison["spark-submit"]["kafka_over_files_cycle"] == 1.25
    assert comparison["spark-submit"]["kafka_within_files_time"] is False
    assert comparison["spark-submit"]["both_exact"] is False
    assert speedups(results) == {"speedup_per_table_run": 2.0, "speedup_per_table_run_kafka": 3.33}
    # One source only: no comparison; a result without `source` (older reports) is files.
    files_only = [{k: v for k, v in r.items() if k != "source"} for r in results[::2]]
    assert kafka_vs_files(files_only) == {}
    assert speedups(files_only) == {"speedup_per_table_run": 2.0}


def test_cycle_spec_rejects_a_source_it_does_not_know() -> None:
    for spec, text in (
        (CycleSpec(sources=()), "--source must be files, kafka or both, not ()"),
        (CycleSpec(sources=("s3",)), "--source must be files, kafka or both, not ('s3',)"),  # type: ignore[arg-type]
        (CycleSpec(sources=("kafka",), kafka_partitions=0), "Kafka topics need a partition"),
    ):
        try:
            spec.validate()
        except ValueError as error:
            assert str(error).startswith(text)
        else:
            raise AssertionError(f"{spec} was accepted")
    CycleSpec(sources=("files", "kafka")).validate()


def test_a_later_cycle_comes_after_the_earlier_ones_and_lands_beside_them(tmp_path: Path) -> None:
    """Cycle 1's changes follow cycle 0's (higher SEQ; an insert-only table's new IDs), touch
    the same upsert keys, and land as part-00001 beside part-00000; the expectation of both
    cycles is the latest per key over all of them."""
    first, second = (generate_table(0, 60, HOUR, seed=4, cycle=c) for c in (0, 1))
    assert max(r["SEQ"] for r in first.rows) < min(r["SEQ"] for r in second.rows)
    assert {r["ID"] for r in first.rows} & {r["ID"] for r in second.rows}
    assert generate_table(0, 60, HOUR, seed=4, cycle=1) == second
    events = [generate_table(2, 60, HOUR, seed=4, cycle=c) for c in (0, 1)]
    assert not {r["ID"] for r in events[0].rows} & {r["ID"] for r in events[1].rows}
    both = BenchTable(0, first.kind, first.rows + second.rows)
    latest = {}
    for row in sorted(both.rows, key=lambda r: r["SEQ"]):
        latest[row["ID"]] = row
    assert [r[0] for r in expected_rows(both)] == sorted(
        k for k, r in latest.items() if r["FLAG"] != "D"
    )
    write_landing(first, tmp_path, HOUR)
    later = write_landing(second, tmp_path, HOUR + timedelta(minutes=15), part=1)
    assert sorted(p.name for p in later.parent.iterdir()) == [
        "part-00000.parquet",
        "part-00001.parquet",
    ]


def test_the_guard_of_an_earlier_cycle_lets_the_next_run_come_but_not_too_soon() -> None:
    """A run of an earlier cycle's interval is known; a run of a later interval while this
    cycle (not the last) waits means the cycle outlasted the period; nothing is paused."""
    fake = _Pauses()
    later = HOUR + timedelta(minutes=15)
    guard = hour_guard(fake, fake, ["a"], later, every=15, earlier=[HOUR], last=False, now=lambda: later + timedelta(minutes=29))  # type: ignore[arg-type]  # fmt: skip
    done = [RunRow("a", "r2", "scheduled", "success", later, None, None)]
    fake.others = [RunRow("a", "r1", "scheduled", "success", HOUR, None, None)]
    guard(done)
    assert fake.paused == []
    fake.others = [RunRow("b", "r3", "scheduled", "running", later + timedelta(minutes=15), None, None)]  # fmt: skip
    with pytest.raises(BenchCycleError, match="the cycle takes longer than the schedule's period"):
        guard(done)


def test_steady_figures_are_the_later_cycles_median_with_the_first_apart() -> None:
    def cycle(number: int, seconds: float, problems: list[str]) -> dict:
        return {
            "cycle": number,
            "interval_start": f"start-{number}",
            "cycle_seconds": seconds,
            "per_table_run_seconds": seconds / 10,
            "run_seconds_median": 1.0,
            "run_seconds_max": 2.0,
            "first_task_start": f"first-{number}",
            "last_task_end": f"last-{number}",
            "runs_succeeded": 10,
            "runs_failed": [],
            "tables_exact": 10 - len(problems),
            "check_problems": problems,
            "tasks": {"stage": number},
            "gantt": [number],
            "kinds": {"partitioned": 4},
        }

    figures = steady_figures([cycle(1, 90.0, []), cycle(2, 60.0, ["t: 1 row"]), cycle(3, 50.0, [])])
    assert (figures["cycle_seconds"], figures["first_cycle_seconds"]) == (55.0, 90.0)
    assert figures["later_cycle_seconds"] == [60.0, 50.0]
    assert (
        figures["figures_from"]
        == "median of cycles 2-3 (cycle 1: the first after the server started)"
    )
    assert (figures["tasks"], figures["gantt"], figures["interval_start"]) == (
        {"stage": 3},
        [3],
        "start-1",
    )
    assert (figures["tables_exact"], figures["check_problems"]) == (9, ["cycle 2: t: 1 row"])
    assert figures["runs_succeeded"] == 30 and len(figures["per_cycle"]) == 3
    alone = steady_figures([cycle(1, 90.0, [])])
    assert (alone["cycle_seconds"], alone["figures_from"]) == (90.0, "the one cycle")


def test_the_auto_cdc_peer_looks_for_its_test_jar_where_make_test_fetches_it() -> None:
    """`make .tools/spark-test-catalog/.fetched` puts the jar under the project's .tools (the
    module moved into cdc_tools/bench/ once and looked one folder too deep)."""
    from cdc_tools.bench import auto_cdc

    project = Path(__file__).resolve().parents[2]
    assert (project / "Makefile").exists()
    assert project / ".tools" / "spark-test-catalog" == auto_cdc.TEST_CATALOG_DIR


def test_the_servers_own_warm_up_is_read_from_its_log(tmp_path: Path) -> None:
    from types import SimpleNamespace

    log = tmp_path / "spark-connect.log"
    local: Any = SimpleNamespace(connect_server=SimpleNamespace(log_path=log))
    log.write_text("cdc connect driver: the Spark Connect plugin is serving\n")
    assert server_warm_up(local) == {"server_warm_up": "none in the server's log"}
    log.write_text("x\ncdc warm-up: done in 34.8 s, at 2026-12-05T22:47:12+00:00\ny\n")
    assert server_warm_up(local) == {
        "server_warm_up": "done",
        "server_warm_up_seconds": 34.8,
        "server_warm_up_done_at": "2026-12-05T22:47:12+00:00",
    }
    failed = "cdc warm-up: failed, the server serves on cold: RuntimeError('x')"
    log.write_text(failed + "\n")
    assert server_warm_up(local) == {"server_warm_up": failed}
    assert server_warm_up(SimpleNamespace(connect_server=None)) == {}  # type: ignore[arg-type]
