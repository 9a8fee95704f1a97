"""The Connect server's warm-up without a server: its switch, its change sets against a
latest-change-per-key model, and the removal of a killed warm-up's folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdc_airflow.local import connect_server, warm_up


def test_the_environment_switches_the_warm_up_off_and_the_servers_conf_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(connect_server.WARM_UP_ENV, raising=False)
    assert "spark.cdc.warmUp" not in connect_server.server_conf(15002)  # on: the default
    monkeypatch.setenv(connect_server.WARM_UP_ENV, " False ")
    assert connect_server.server_conf(15002)["spark.cdc.warmUp"] == "false"
    on = connect_server.server_conf(15002, {"spark.cdc.warmUp": "true"})
    assert on["spark.cdc.warmUp"] == "true"
    monkeypatch.setenv(connect_server.WARM_UP_ENV, "true")
    assert "spark.cdc.warmUp" not in connect_server.server_conf(15002)


def test_the_change_sets_leave_the_rows_the_warm_up_expects() -> None:
    latest: dict[int, dict[str, object]] = {}  # the model: the highest SEQ per key wins
    for run in range(3):
        rows = warm_up.changes(run)
        assert len({row["ID"] for row in rows}) == len(rows)  # a key once per run
        for row in rows:
            if row["ID"] not in latest or row["SEQ"] > latest[row["ID"]]["SEQ"]:  # type: ignore[operator]
                latest[row["ID"]] = row  # type: ignore[index]
        alive = [row for row in latest.values() if row["FLAG"] != "D"]
        assert warm_up.expected_rows(run + 1) == len(alive)
    assert 0 < warm_up.expected_rows(2) < warm_up.KEYS  # deletes and re-inserts both happen
    assert {row["FLAG"] for row in warm_up.changes(0)} == {"I"}
    assert {row["FLAG"] for row in warm_up.changes(1)} == {"U", "D"}
    assert {row["FLAG"] for row in warm_up.changes(2)} == {"I", "U", "D"}  # re-inserts
    assert any("NAME" not in row for row in warm_up.changes(1))  # key-only deletes


def test_a_killed_warm_ups_folder_goes_and_a_running_ones_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    gone = tmp_path / f"{warm_up.FOLDER_PREFIX}{2**22 + 1}-abc"  # above pid_max: no process
    alive = tmp_path / f"{warm_up.FOLDER_PREFIX}{os.getpid()}-def"
    other = tmp_path / "cdc-warm-up-notes"
    for folder in (gone, alive, other):
        (folder / "landing").mkdir(parents=True)
    warm_up.remove_orphans()
    assert not gone.exists() and alive.exists() and other.exists()
