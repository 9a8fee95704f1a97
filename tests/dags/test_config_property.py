"""Property: whatever `cdc validate` accepts, Airflow loads, and its cadences evaluate.

Rows are drawn with cron fields inside and outside their ranges, presets (and @once), and
partition expressions from the allowed and refused corpora; the rows validation accepts must
become DAGs in a real DagBag without import errors, and their maintenance cadences must
evaluate (`is_due`) on a few intervals. The preset table is also checked against Airflow's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_pipeline.config import load_table_configs
from cdc_pipeline.schedules import PRESETS, is_due

DAGS = Path(__file__).resolve().parents[2] / "dags"
ERRORS_FILE = str(DAGS / "cdc_config_errors.py")


def cron_field(low: int, high: int) -> st.SearchStrategy[str]:
    """One cron field, its values drawn a little past both ends of the valid range."""
    value = st.integers(low - 1, high + 2).map(str)
    return st.one_of(
        st.just("*"),
        value,
        st.builds(lambda a, b: f"{a}-{b}", value, value),
        st.integers(0, high + 1).map(lambda n: f"*/{n}"),
    )


CRON = st.builds(
    lambda *f: " ".join(f),
    cron_field(0, 59),
    cron_field(0, 23),
    cron_field(1, 31),
    cron_field(1, 12),
    cron_field(0, 6),
)
SCHEDULE = st.one_of(CRON, st.sampled_from([*PRESETS, "@once", "@every_day", "0 0 30 2 *"]))
EXPRESSIONS = st.sampled_from(
    [
        None,
        "year(TS)",
        "pmod(xxhash64(ID), 4)",
        "date_format(TS, 'yyyy-MM')",
        "rand()",
        "java_method('java.lang.System', 'getenv', 'HOME')",
        "NOPE + 1",
    ]
)


@st.composite
def rows(draw: st.DrawFn, index: int) -> dict:
    row: dict = {
        "name": f"t{index}",
        "file_format": "csv",
        "columns": {"ID": "bigint", "TS": "timestamp"},
        "keys": ["ID"],
        "sequence_by": ["TS"],
        "schedule": draw(SCHEDULE),
        "optimize_schedule": draw(st.one_of(st.none(), SCHEDULE)),
        "vacuum_schedule": draw(st.one_of(st.none(), SCHEDULE)),
    }
    expression = draw(EXPRESSIONS)
    if expression is not None:
        row.update(partition_expression=expression, partition_column="P")
    return row


CONFIGS = st.integers(1, 3).flatmap(lambda n: st.tuples(*[rows(i) for i in range(n)]))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(config=CONFIGS)
def test_what_validate_accepts_airflow_loads_and_cadences_evaluate(
    config: tuple[dict, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    path = tmp_path / "tables.yaml"
    path.write_text(yaml.safe_dump({"tables": list(config)}))
    result = load_table_configs(path)
    monkeypatch.setenv("CDC_CONFIG", str(path))
    bag = DagBag(dag_folder=str(DAGS))
    assert sorted(bag.dag_ids) == sorted(f"cdc_{name}" for name in result.tables)
    # The only import error is the file that lists the refused rows, and only when some are.
    assert list(bag.import_errors) == ([ERRORS_FILE] if result.problems else [])
    start = datetime(2024, 2, 28, 22, tzinfo=UTC)
    for table in result.tables.values():
        for cadence in (table.optimize_schedule, table.vacuum_schedule):
            for hours in (0, 1, 24, 24 * 40):
                begin = start + timedelta(hours=hours)
                is_due(cadence, begin, begin + timedelta(hours=1))


def test_presets_cover_airflows_table_with_the_same_crons() -> None:
    from airflow.sdk.definitions.timetables._cron import CRON_PRESETS

    assert {name: PRESETS[name] for name in CRON_PRESETS} == CRON_PRESETS
