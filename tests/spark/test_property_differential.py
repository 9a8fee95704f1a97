"""Property-based differential test: random change streams through stage + overwrite-final.

Hypothesis draws small, hostile change streams over a few composite keys (duplicates, late and
out-of-order changes, ties on the first sequence column broken by the second, fully equal
sequences broken by arrival, partition moves, key-only deletes, re-inserts after deletes, lower
case flags), spreads them over 2-4 hour folders that cross midnight, lands each file before a
run it also draws (so files land in hour folders whose runs are over: late arrivals), and runs
the hours in an order it draws, rerunning one applied hour on the way. A run over an hour stages
every landed file of that hour and the earlier ones (its late-arrival window) and applies every
staged change: after every step the final Delta table must equal the pure-Python model
(tests/property_model.py) over the files those runs have seen, row for row, with no key twice;
a rerun stages only files landed since, and changes nothing when there are none.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from cdc_pipeline.paths import TablePaths
from spark_jobs import overwrite_final
from spark_jobs.overwrite import key_lookup
from spark_jobs.runtime.report import StepReport
from spark_jobs.staging import readers
from tests.helpers import Workspace, table_rows
from tests.property_model import Landed, TableModel
from tests.spark.steps import run

pytestmark = pytest.mark.spark

TABLE = "prop"
COLUMNS = {
    "K1": "bigint",
    "K2": "string",
    "VAL": "int",
    "REGION": "string",
    "TS": "timestamp",
    "SEQ2": "bigint",
}
CONFIG = {
    "name": TABLE,
    "file_format": "json",
    "columns": COLUMNS,
    "keys": ["K1", "K2"],
    "sequence_by": ["TS", "SEQ2"],
    "partition_expression": "upper(substring(REGION, 1, 2))",
    "partition_column": "REGION_P",
    "history": True,
    "history_buckets": 2,
}
MODEL = TableModel(
    columns=COLUMNS,
    keys=("K1", "K2"),
    sequence_by=("TS", "SEQ2"),
    partition_column="REGION_P",
    partition=lambda row: row["REGION"][:2].upper(),
)
OUTPUT = MODEL.output_columns
ARRIVAL = ["_cdc_batch", "_cdc_file", "_cdc_row"]
TOMBSTONE = ["K1", "K2", "TS", "SEQ2", *ARRIVAL]
VERSION = ["_cdc_valid_from", "_cdc_valid_to", "_cdc_is_current", "_cdc_is_deleted"]
FIRST_HOUR = datetime(2024, 1, 1, 22, tzinfo=UTC)  # 2-4 hours: the folders cross midnight
KEY_POOL = [(1, "a"), (1, "b"), (2, "a"), (2, "b")]
REGIONS = ["eu-west", "us-east", "eu-north", "ap-south"]  # partitions EU, US, AP
# Arrival compares file names as text: 'f10.json' comes before 'f9.json'.
FILES = ["a.json", "b.json", "f10.json", "f9.json"]


def hour_text(hour: int) -> str:
    return (FIRST_HOUR + timedelta(hours=hour)).strftime("%Y-%m-%dT%H")


def ts_text(second: int) -> str:
    return (datetime(2024, 1, 1, tzinfo=UTC) + timedelta(seconds=second)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


@dataclass(frozen=True)
class Scenario:
    """Landed rows in file order (hour index, file name, row), the apply order and the rerun."""

    n_hours: int
    rows: tuple[tuple[int, str, dict[str, Any]], ...]
    order: tuple[int, ...]
    rerun_after: int  # the step after which ...
    rerun_hour: int  # ... this already applied hour runs again
    arrivals: tuple[tuple[tuple[int, str], int], ...] = ()  # file -> the step it lands before

    def lands_before(self, file: tuple[int, str]) -> int:
        """The step before which the file lands (0: before the first run)."""
        return dict(self.arrivals).get(file, 0)

    def landed(self) -> list[Landed]:
        """Every row with its arrival; positions follow the order of `rows` within a file."""
        counts: dict[tuple[int, str], int] = {}
        result = []
        for hour, name, values in self.rows:
            position = counts.get((hour, name), 0)
            counts[(hour, name)] = position + 1
            result.append(Landed(hour_text(hour), name, position, values))
        return result

    def files(self) -> dict[tuple[int, str], list[dict[str, Any]]]:
        grouped: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for hour, name, values in self.rows:
            grouped.setdefault((hour, name), []).append(values)
        return grouped


def change(
    flag: str,
    key: tuple[int, str],
    ts: int,
    seq2: int,
    val: int | None = None,
    region: str | None = None,
) -> dict[str, Any]:
    """A change row as written; a key-only D has neither VAL nor REGION."""
    k1, k2 = key
    row: dict[str, Any] = {"FLAG": flag, "K1": k1, "K2": k2, "TS": ts_text(ts), "SEQ2": seq2}
    if region is not None:
        row.update(VAL=val, REGION=region)
    return row


# partition_stable: each key keeps its partition (its region text may still change within it).
STABLE_REGIONS = {
    (1, "a"): ["eu-west", "eu-north"],
    (1, "b"): ["us-east"],
    (2, "a"): ["ap-south"],
    (2, "b"): ["eu-north", "eu-west"],
}


@st.composite
def change_rows(
    draw: st.DrawFn, keys: list[tuple[int, str]], stable: bool = False
) -> dict[str, Any]:
    key = draw(st.sampled_from(keys))
    flag = draw(st.sampled_from(["U", "I", "D", "u", "d"]))
    # Few sequence values, so equal TS (broken by SEQ2) and fully equal sequences are common.
    ts = draw(st.integers(0, 2))
    seq2 = draw(st.integers(0, 1))
    if flag.upper() == "D" and draw(st.booleans()):
        return change(flag, key, ts, seq2)  # key-only delete
    val = draw(st.none() | st.integers(0, 99))
    regions = STABLE_REGIONS[key] if stable else REGIONS
    return change(flag, key, ts, seq2, val, draw(st.sampled_from(regions)))


@st.composite
def scenarios(draw: st.DrawFn, stable: bool = False) -> Scenario:
    n_hours = draw(st.integers(2, 4))
    keys = draw(st.lists(st.sampled_from(KEY_POOL), min_size=1, max_size=4, unique=True))
    hours = st.integers(0, n_hours - 1)
    rows: list[tuple[int, str, dict[str, Any]]] = [
        (draw(hours), draw(st.sampled_from(FILES)), values)
        for values in draw(st.lists(change_rows(keys, stable), min_size=4, max_size=12))
    ]
    # Duplicates: a row landed again, in the same or a later hour, anywhere in the file order.
    for _ in range(draw(st.integers(0, 3))):
        hour, _name, values = rows[draw(st.integers(0, len(rows) - 1))]
        copy = (draw(st.integers(hour, n_hours - 1)), draw(st.sampled_from(FILES)), dict(values))
        rows.insert(draw(st.integers(0, len(rows))), copy)
    order = tuple(draw(st.permutations(range(n_hours))))
    rerun_after = draw(st.integers(0, n_hours - 1))
    rerun_hour = draw(st.sampled_from(order[: rerun_after + 1]))
    files = sorted({(hour, name) for hour, name, _ in rows})
    steps = st.integers(0, n_hours - 1)
    arrivals = tuple((file, draw(steps)) for file in files)
    return Scenario(n_hours, tuple(rows), order, rerun_after, rerun_hour, arrivals)


K1A, K1B, K2A = (1, "a"), (1, "b"), (2, "a")
# Hours 0, 1, 2 are 2024-01-01T22, 2024-01-01T23 and 2024-01-02T00.
NASTY = Scenario(
    n_hours=3,
    rows=(
        (0, "a.json", change("I", K1A, 1, 0, 1, "eu-west")),
        (0, "a.json", change("I", K1B, 1, 0, 1, "us-east")),
        (0, "a.json", change("I", K2A, 0, 0, 5, "ap-south")),
        # Fully equal sequence, later file of the same hour: wins, and moves EU -> US.
        (0, "b.json", change("U", K1A, 1, 0, 2, "us-east")),
        # Re-insert after the delete below: equal TS, and SEQ2 beats the delete's later arrival.
        (1, "f10.json", change("I", K1B, 2, 1, 3, "eu-north")),
        # Fully equal sequence with the hour-2 update of K2A: loses to that later arrival.
        (1, "f10.json", change("u", K2A, 0, 0, 6, "ap-south")),
        # The hour-0 insert of K1A landed again an hour later ('f9.json' sorts after 'f10.json').
        (1, "f9.json", change("I", K1A, 1, 0, 1, "eu-west")),
        # Late: older TS than K1B's delete, however high its SEQ2.
        (2, "a.json", change("U", K1B, 1, 9, 9, "eu-north")),
        # Key-only delete (lower case flag) of K1B, held in partition US when hour 2 runs.
        (2, "a.json", change("d", K1B, 2, 0)),
        # Equal sequence, latest arrival: moves K2A from AP to US.
        (2, "a.json", change("U", K2A, 0, 0, 7, "us-east")),
        # Key-only delete with a fully equal sequence: beats K1A's hour-0 rows and duplicate.
        (2, "a.json", change("D", K1A, 1, 0)),
    ),
    # Hour 2 before hour 1: the delete of K1B is remembered, then beaten by the re-insert;
    # the late duplicate of K1A and the older update of K2A lose to hour 2.
    order=(0, 2, 1),
    rerun_after=1,
    rerun_hour=0,
)


@contextmanager
def fresh_workspace() -> Iterator[Workspace]:
    """What the `workspace` fixture gives, per hypothesis example (env restored afterwards)."""
    with tempfile.TemporaryDirectory(prefix="cdc-property-") as tmp:
        ws = Workspace(Path(tmp))
        env = {
            "CDC_LANDING": str(ws.landing),
            "CDC_WAREHOUSE": str(ws.warehouse),
            "CDC_CONFIG": str(ws.config_path),
        }
        with mock.patch.dict(os.environ, env):
            yield ws


def rows_of(path: Path, columns: list[str]) -> list[tuple[Any, ...]]:
    """A Delta table's rows, or none when no run has created it yet."""
    return table_rows(path, columns) if (path / "_delta_log").is_dir() else []


def state(paths: TablePaths) -> tuple[list[tuple[Any, ...]], ...]:
    """Final rows with their arrival, the tombstones and the history: what a rerun must keep."""
    return (
        rows_of(paths.final, OUTPUT + ARRIVAL),
        rows_of(paths.tombstones, TOMBSTONE),
        rows_of(paths.history, OUTPUT + ARRIVAL + VERSION),
    )


def features(scenario: Scenario) -> list[str]:
    """What the drawn stream exercises (shown by --hypothesis-show-statistics)."""
    landed = [(c, MODEL.typed_row(c), MODEL.rank(c), MODEL.flag(c)) for c in scenario.landed()]
    found = set()
    for a, row_a, rank_a, flag_a in landed:
        if flag_a == "D" and "REGION" not in a.values:
            found.add("key-only delete")
        if a.values["FLAG"] != flag_a:
            found.add("lower case flag")
        for b, row_b, rank_b, flag_b in landed:
            if a is b or (row_a["K1"], row_a["K2"]) != (row_b["K1"], row_b["K2"]):
                continue
            if a.values == b.values:
                found.add("duplicate")
            elif rank_a[0] == rank_b[0]:
                found.add("fully equal sequence")
            elif row_a["TS"] == row_b["TS"]:
                found.add("equal TS, SEQ2 decides")
            if a.batch > b.batch and rank_a < rank_b:
                found.add("late older change")
            regions = {row_a["REGION"], row_b["REGION"]}
            if None not in regions and len({r[:2] for r in regions}) == 2:
                found.add("partition move")
            if flag_a == "D" and flag_b != "D" and rank_b > rank_a:
                found.add("insert or update after delete")
    return sorted(found)


# Settings of both property tests: Spark runs are slow, examples fixed, nothing remembered.
SPARK_EXAMPLES: dict[str, Any] = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
}


@settings(
    max_examples=8,  # each example is 3-5 Spark runs of about 2 s: the file stays under 3 min
    **SPARK_EXAMPLES,
)
@given(scenario=scenarios())
@example(scenario=NASTY)
def test_random_streams_in_any_order_match_the_model(spark, scenario: Scenario) -> None:
    check_against_model(spark, scenario, CONFIG)


@settings(
    max_examples=4,  # about 20 s each here, with history
    **SPARK_EXAMPLES,
)
@given(scenario=scenarios(stable=True))
def test_partition_stable_streams_match_the_model(spark, scenario: Scenario) -> None:
    """The same, for a table declared partition_stable whose keys never move: the lookup runs
    only for key-only deletes, and the result must not differ."""
    check_against_model(spark, scenario, {**CONFIG, "partition_stable": True})


@settings(
    max_examples=3,
    **SPARK_EXAMPLES,
)
@given(scenario=scenarios())
@example(scenario=NASTY)
def test_streams_ranked_over_many_tasks_match_the_model(spark, scenario: Scenario) -> None:
    """The same with every step taking the way of a change set too large for one task: stage
    persists the typed rows in Spark's cache (not brought to the driver) and reads them in
    several tasks, and overwrite-final ranks them spread over tasks (a shuffle by key before
    it, one by partition after it) and reads the keys of every file it may replace. These
    small ones otherwise take the one-task ways and replace such files unread."""
    with (
        mock.patch.object(overwrite_final, "ONE_TASK_ROWS", -1),
        mock.patch.object(readers, "ONE_TASK_BYTES", -1),
        mock.patch.object(key_lookup, "UNREAD_ROWS_MAX", -1),
    ):
        check_against_model(spark, scenario, CONFIG)


def check_against_model(spark: Any, scenario: Scenario, config: dict[str, Any]) -> None:
    """Land each file before its step, run the scenario's hours in its order (with its rerun);
    compare after every run."""
    for feature in features(scenario):
        event(feature)
    if any(step for _, step in scenario.arrivals):
        event("file landed after a run of its hour or a later one")
    with fresh_workspace() as ws:
        table = ws.configure(config)[TABLE]
        paths = ws.paths(TABLE)
        files = scenario.files()
        landed_rows = scenario.landed()
        landed: set[tuple[int, str]] = set()
        seen: set[tuple[int, str]] = set()  # files a run has listed: staged and applied

        def run_and_compare(hour: int, ran: list[int]) -> StepReport:
            staged = {f for f in landed - seen if f[0] <= hour}
            seen.update(staged)
            report, _ = run(spark, ws, table, hour_text(hour), hour_text(hour + 1))
            assert report.counts["new_files"] == len(staged)
            so_far = [c for c in landed_rows if (hour_of(c.batch), c.file) in seen]
            expected = MODEL.final(so_far)
            actual = rows_of(paths.final, OUTPUT)
            keys = [row[:2] for row in actual]
            where = f"after hours {[hour_text(h) for h in ran]}, files {sorted(seen)}"
            assert len(keys) == len(set(keys)), f"a key twice in final: {actual}"
            assert {row[:2]: row for row in actual} == expected, (
                f"{where}: final {sorted(actual)} != model {sorted(expected.values())}"
            )
            history = rows_of(paths.history, OUTPUT + VERSION)
            assert history == MODEL.history(so_far), (
                f"{where}: history {history} != model {MODEL.history(so_far)}"
            )
            return report

        ran: list[int] = []
        for step, hour in enumerate(scenario.order):
            for file, rows in files.items():
                if scenario.lands_before(file) == step:
                    ws.land(TABLE, hour_text(file[0]), file[1], rows, file_format="json")
                    landed.add(file)
            ran.append(hour)
            run_and_compare(hour, ran)
            if step == scenario.rerun_after:
                before = state(paths)
                new = {f for f in landed - seen if f[0] <= scenario.rerun_hour}
                restage = run_and_compare(scenario.rerun_hour, [*ran, scenario.rerun_hour])
                if not new:
                    assert restage.counts["staged"] == 0
                    assert state(paths) == before, (
                        f"rerun of hour {scenario.rerun_hour} changed something"
                    )
        # Nothing was quarantined: every drawn row is a valid change.
        assert rows_of(paths.quarantine, ["K1"]) == []


def hour_of(batch: str) -> int:
    """The scenario's hour index of a batch id."""
    start = datetime.strptime(batch, "%Y-%m-%dT%H").replace(tzinfo=UTC)
    return int((start - FIRST_HOUR).total_seconds() // 3600)
