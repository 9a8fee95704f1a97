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
        # The server starts with the steps' SQL settings as its defaults (server_conf); the
        # partitions, 2 on the test run's server, show that the session's request arrived.
    finally:
        session.stop()


def test_one_request_applies_every_setting_and_a_refused_one_fails_it_by_name(
    connect_server: Any,
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
        # Every setting of one request applies, each differing from the server's default.
        settings = {
            "spark.sql.shuffle.partitions": "6",
            "spark.sql.session.timeZone": "Europe/Paris",
            "spark.sql.ansi.enabled": "true",
            "spark.sql.sources.parallelPartitionDiscovery.threshold": "77",
        }
        set_session_conf(session, settings)
        assert {key: session.conf.get(key) for key in settings} == settings
    finally:
        session.stop()


def test_a_run_that_is_not_small_gets_the_servers_plan_back(connect_server: Any) -> None:
    """A session that planned a small run (no adaptive execution, no whole-stage codegen) and
    then plans a larger one has the server's settings again, not the small run's: `cdc demo`
    keeps one session for every step, and a large run's shuffle would otherwise be written
    partition by partition."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from spark_jobs.runtime.session import SMALL_RUN_CONF, plan_run

    session = ConnectSession.builder.remote(connect_server.url).create()
    try:
        server = {key: session.conf.get(key) for key in SMALL_RUN_CONF}
        assert server != SMALL_RUN_CONF  # the test run's server plans adaptively
        plan_run(session, small=True)
        assert {key: session.conf.get(key) for key in SMALL_RUN_CONF} == SMALL_RUN_CONF
        plan_run(session, small=False)
        assert {key: session.conf.get(key) for key in SMALL_RUN_CONF} == server
    finally:
        session.stop()
