"""One Airflow home for `make airflow` and `cdc demo`, held by one of them at a time."""

from __future__ import annotations

import os
import stat
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest

from cdc_airflow.local import launcher
from cdc_airflow.local.home import LOCK_FILE, HomeInUseError, claim_home, default_home
from cdc_pipeline.config import load_table_configs
from cdc_tools import demo


class Started(Exception):
    """Raised where the local Airflow would start its first process."""


class RecordedAirflow:
    """Stands for LocalAirflow: records the home it is given and stops at the first start."""

    homes: ClassVar[list[Path]] = []

    def __init__(self, home: Path, *args: Any, **kwargs: Any) -> None:
        self.home = home
        self.url = "http://127.0.0.1:8080"
        self.spark_connection = None
        RecordedAirflow.homes.append(home)

    def migrate(self) -> None:
        raise Started

    def start_spark(self, *, wait: bool = True) -> None:
        raise Started

    def stop(self) -> None:
        pass


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> type[RecordedAirflow]:
    """The launcher's LocalAirflow recorded; the project root a private folder; no signal
    handlers changed in the test process."""
    RecordedAirflow.homes = []
    monkeypatch.setattr(launcher, "LocalAirflow", RecordedAirflow)
    monkeypatch.setattr("cdc_airflow.local.home.project_root", lambda: tmp_path)
    monkeypatch.setattr(launcher.signal, "signal", lambda *args: None)
    monkeypatch.setattr(sys, "argv", ["make airflow"])
    monkeypatch.delenv("AIRFLOW_HOME", raising=False)
    monkeypatch.delenv("CDC_SPARK_REMOTE", raising=False)
    return RecordedAirflow


def start_demo() -> None:
    configs = load_table_configs()
    demo.run_airflow_demo(
        configs, Path("config/tables.yaml"), datetime(2024, 1, 1, tzinfo=UTC), 3, 10
    )


@pytest.mark.parametrize("airflow_home", [None, "elsewhere"])
def test_the_demo_runs_in_the_home_make_airflow_serves(
    recorded: type[RecordedAirflow],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    airflow_home: str | None,
) -> None:
    """`<project>/airflow_home`, or `$AIRFLOW_HOME`: the same for both, so the demo's runs are
    in `make airflow` afterwards."""
    expected = tmp_path / "airflow_home"
    if airflow_home:
        expected = tmp_path / airflow_home
        monkeypatch.setenv("AIRFLOW_HOME", str(expected))
    with pytest.raises(Started):
        launcher.serve()
    with pytest.raises(Started):
        start_demo()
    assert recorded.homes == [expected, expected] and default_home() == expected


def test_the_demo_refuses_a_home_make_airflow_runs_on_before_starting_anything(
    recorded: type[RecordedAirflow], tmp_path: Path
) -> None:
    home = tmp_path / "airflow_home"
    with (
        claim_home(home, by="make airflow on http://127.0.0.1:8080"),
        pytest.raises(HomeInUseError) as refused,
    ):
        start_demo()
    assert str(refused.value) == (
        f"the local Airflow home {home} is in use by make airflow on http://127.0.0.1:8080 "
        f"(pid {os.getpid()}): stop it (Ctrl-C where it runs) and try again, or give one of "
        "them another home (AIRFLOW_HOME=/other/folder)"
    )
    assert recorded.homes == []  # nothing made, nothing started
    with pytest.raises(Started):  # released when the holder is done
        start_demo()


def test_make_airflow_refuses_the_home_while_a_demo_runs_in_it(
    recorded: type[RecordedAirflow], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with claim_home(tmp_path / "airflow_home", by="cdc demo"):
        assert launcher.serve() == 1
    error = capsys.readouterr().err
    assert error.startswith("error: the local Airflow home ") and error.count("\n") == 1
    assert f"in use by cdc demo (pid {os.getpid()}): stop it" in error


def test_the_lock_is_the_owners_only_and_names_no_holder_once_released(tmp_path: Path) -> None:
    home = tmp_path / "new" / "home"
    with claim_home(home, by="cdc demo") as claimed:
        assert claimed == home
        lock = home / LOCK_FILE
        assert lock.read_text() == f"cdc demo (pid {os.getpid()})"
        assert stat.S_IMODE(lock.stat().st_mode) == 0o600
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert lock.read_text() == ""
    with claim_home(home, by="make airflow"):
        assert lock.read_text().startswith("make airflow (pid ")
