"""A step's Connect session gets its SQL settings in one request (session.set_session_conf), with
what `spark.conf.set` one at a time gave: every setting applied, a refused one failing the call
by name."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.spark


def test_a_steps_session_has_every_setting_the_steps_rely_on(
    connect_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spark_jobs.runtime.session import REQUIRED_SQL_CONF, build_connect_session

    monkeypatch.setenv("CDC_SHUFFLE_PARTITIONS", "3")
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "")  # restored: the build switches it on
    monkeypatch.delenv("CDC_SPARK_TAGS", raising=False)
    session = build_connect_session(connect_server.url, "cdc-conf-test")
    try:
        wanted = {**REQUIRED_SQL_CONF, "spark.sql.shuffle.partitions": "3"}
        assert {key: session.conf.get(key) for key in wanted} == wanted
        # The server's default differs from the steps' for every one of these but the time zone
        # and the overwrite mode (checked here so that a setting never sent would show).
        assert session.conf.get("spark.sql.sources.parallelPartitionDiscovery.threshold") == (
            "100000"
        )
    finally:
        session.stop()


def test_a_refused_setting_fails_the_request_naming_it(
    connect_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from spark_jobs.runtime.session import set_session_conf

    session = ConnectSession.builder.remote(connect_server.url).create()
    try:
        with pytest.raises(Exception, match=r"spark\.sql\.warehouse\.dir"):
            set_session_conf(
                session,
                {"spark.sql.shuffle.partitions": "5", "spark.sql.warehouse.dir": "/elsewhere"},
            )
        # The settings before the refused one are applied, as with one request each.
        assert session.conf.get("spark.sql.shuffle.partitions") == "5"
        set_session_conf(session, {"spark.sql.shuffle.partitions": "6"})
        assert session.conf.get("spark.sql.shuffle.partitions") == "6"
    finally:
        session.stop()
