"""The cycle bench's warm-up pass through a real Connect server: every table staged and
overwritten on its own copy of the folders, each checked exact, the copy removed after."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_tools.bench.cycle import CONN_ID, generate_table, warm_server

pytestmark = [pytest.mark.cli]

HOUR = datetime(2024, 3, 4, 5, tzinfo=UTC)


def test_the_warm_up_pass_runs_every_table_exactly_on_its_own_folders(
    connect_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pass switches this process's PySpark to Connect: back to classic after the test.
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    tables = [generate_table(i, 30, HOUR, 7) for i in range(3)]  # one of each kind
    config = tmp_path / "tables.yaml"
    config.write_text(yaml.safe_dump({"tables": [t.config_row(CONN_ID) for t in tables]}))
    folder = tmp_path / "warm-up"

    # Raises BenchCycleError naming the table when its final rows are not the expected ones.
    seconds = warm_server(connect_server.url, config, tables, HOUR, folder)

    assert seconds > 0
    assert not folder.exists()
