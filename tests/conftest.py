"""Shared fixtures: one local Spark session for every Spark test, and an isolated data root per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Workspace


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """The one Spark session of the test run (local[2], 2 shuffle partitions)."""
    os.environ.setdefault("CDC_SHUFFLE_PARTITIONS", "2")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only
    from spark_jobs.session import build_spark_session

    session = build_spark_session("cdc-tests", master="local[2]")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workspace]:
    """Landing and warehouse roots of this test only (CDC_LANDING / CDC_WAREHOUSE point at them)."""
    ws = Workspace(tmp_path)
    monkeypatch.setenv("CDC_LANDING", str(ws.landing))
    monkeypatch.setenv("CDC_WAREHOUSE", str(ws.warehouse))
    monkeypatch.setenv("CDC_CONFIG", str(ws.config_path))
    yield ws
