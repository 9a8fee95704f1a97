"""Shared fixtures: one Spark session per mode for every Spark test, and an isolated data root
per test.

Spark runs in two modes with the same results: classic (a JVM in the test process, `local[2]`)
and Spark Connect (a client of one local Connect server, started once per test run from the
pip package). The markers (declared in pyproject.toml) decide: `spark` tests run classic; `cli`
tests run their `cdc` processes as clients of the one server, as Airflow's tasks do (a classic
`cdc` process starts a JVM of its own: about 20 s each); tests marked `classic_only` (the CLI
as a user runs it first, without a server; the process's own driver memory and user),
`both_modes` or `connect_only` say otherwise. `CDC_TEST_SPARK_MODES=connect` (or
`classic,connect`) runs every `spark` and `cli` test in those modes instead.

PySpark decides per process which kind of column `F.col` builds (the `SPARK_CONNECT_MODE_ENABLED`
environment variable): a Connect test sets it for its duration only, so both kinds of session
live in one test process. CLI tests in Connect mode hand the server to the `cdc` process through
`CDC_SPARK_REMOTE`.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc_airflow.local.connect_driver import WARM_UP_CONF
from cdc_airflow.local.connect_server import WARM_UP_ENV
from tests.helpers import Workspace

# py4j logs "Closing down clientserver connection" (INFO) from a finalizer at interpreter exit,
# after pytest closed the captured stream Airflow's logging handlers write to: every run ended
# in a "--- Logging error ---" traceback. Its INFO lines say nothing a test needs.
logging.getLogger("py4j").setLevel(logging.WARNING)

CLASSIC, CONNECT = "classic", "connect"

# The Connect servers the tests start (about 20 in a run, many at once) skip the warm-up each
# would run at start (about 27 CPU-s): only the shared `connect_server` below and the warm-up's
# own test run it (tests/cli/test_connect_server_sessions.py).
os.environ[WARM_UP_ENV] = "false"


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM in a test process: as Ctrl-C in the process pytest_configure ran in; in a process
    forked from it, the default (the process ends)."""
    if os.getpid() != _PYTEST_PID:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise KeyboardInterrupt(f"signal {signum}")


_PYTEST_PID = 0  # the process pytest_configure ran in


def pytest_configure(config: pytest.Config) -> None:
    """`make test` stopped by SIGTERM (a CI timeout, `kill`) tears the fixtures down as Ctrl-C
    does, so the servers they started in process groups of their own (PostgreSQL, the S3
    server, Spark, Airflow's services, a Kafka broker) are stopped by them: Python's default
    ends the process with no teardown, and those servers kept running. Each xdist worker is a
    process of its own and gets the same handler."""
    global _PYTEST_PID
    _PYTEST_PID = os.getpid()
    signal.signal(signal.SIGTERM, _terminated)


# Tests that need what `make test` cannot fetch in CI's time or from the indexes it reaches:
# marker -> the variable that runs them (their own make targets set it); deselected otherwise,
# so they never show as skipped.
OPT_IN = {
    # Airflow 3.2.0 installed from the package index, 3-6 min (`make test-lowest-airflow`)
    "lowest_airflow": "CDC_TEST_LOWEST_AIRFLOW",
    # the Airflow Helm chart's values.schema.json, not on any index this machine reaches
    # (`make test-chart-schema`, after downloading it: docs/kubernetes.md)
    "chart_schema": "CDC_TEST_CHART_SCHEMA",
}


# The longest test files (minutes each on 2 cores), first: `make test` hands files to its two
# workers in this order (pytest -n 2 --dist loadfile --no-loadscope-reorder), so no long file
# starts last while the other worker has nothing left to do (xdist's own order, most tests
# first, ran the topology's 4 tests, about 20 minutes, at the end).
LONGEST_FIRST = (
    "tests/deploy/test_topology.py",
    "tests/e2e/test_airflow_ops.py",
    "tests/e2e/test_airflow.py",
    "tests/cli/test_cli.py",
    "tests/spark/test_check.py",
    "tests/cli/test_postgres_debezium_kafka.py",
    "tests/cli/test_postgres_debezium.py",
    "tests/spark/test_overwrite_final.py",
    "tests/cli/test_late_arrivals.py",
    "tests/cli/test_kafka_source.py",
    "tests/spark/test_transforms.py",
    "tests/cli/test_faults.py",
    "tests/spark/test_property_differential.py",
    "tests/wheel_install/test_wheel.py",
    "tests/cli/test_repair.py",
    "tests/cli/test_auto_cdc_cycle.py",
    "tests/e2e/test_plain_airflow.py",
    "tests/cli/test_postgres_wal2json.py",
)


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by the session's Spark mode
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the opt-in tests (OPT_IN) whose variable is not 1; put the longest files first
    (LONGEST_FIRST), the others after them in collection order."""
    off = [marker for marker, variable in OPT_IN.items() if os.environ.get(variable) != "1"]
    chosen = [i for i in items if not any(i.get_closest_marker(m) for m in off)]
    if len(chosen) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in chosen])
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items[:] = sorted(chosen, key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def modes_for(definition: pytest.Function) -> list[str]:
    """The Spark modes a test runs in: its markers (pyproject.toml), Connect for `cli` tests and
    classic for the others; CDC_TEST_SPARK_MODES overrides all but `classic_only`."""
    if definition.get_closest_marker("classic_only"):
        return [CLASSIC]
    chosen = os.environ.get("CDC_TEST_SPARK_MODES")
    if chosen:
        return [m.strip() for m in chosen.split(",") if m.strip()]
    if definition.get_closest_marker("both_modes"):
        return [CLASSIC, CONNECT]
    if definition.get_closest_marker("connect_only") or definition.get_closest_marker("cli"):
        return [CONNECT]
    return [CLASSIC]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize `spark` and `cli` tests by mode: the `spark` fixture directly (one session per
    mode), a `cli` test without it through spark_mode (its `cdc` processes' mode)."""
    definition = metafunc.definition
    cli = definition.get_closest_marker("cli") is not None
    if not cli and definition.get_closest_marker("spark") is None:
        return
    modes = modes_for(definition)
    if modes == [CLASSIC]:
        return
    name = "spark" if "spark" in metafunc.fixturenames else "spark_mode"
    if name == "spark_mode" and not cli:
        return
    metafunc.parametrize(name, modes, indirect=True, scope="session" if name == "spark" else None)


def current_mode(request: pytest.FixtureRequest) -> str:
    """The mode of the running test: its `spark` or `spark_mode` parameter, else classic."""
    callspec = getattr(request.node, "callspec", None)
    params = callspec.params if callspec is not None else {}
    return str(params.get("spark") or params.get("spark_mode") or CLASSIC)


@pytest.fixture(autouse=True)
def spark_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test's Spark mode; in Connect mode PySpark builds Connect columns and `cdc`
    processes get CDC_SPARK_REMOTE."""
    mode = current_mode(request)
    if mode == CONNECT:
        server = request.getfixturevalue("connect_server")
        monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
        monkeypatch.setenv("CDC_SPARK_REMOTE", server.url)
    else:
        monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
        monkeypatch.delenv("CDC_SPARK_REMOTE", raising=False)
    return mode


@pytest.fixture(scope="module", autouse=True)
def classic_between_modules() -> None:
    """Each module starts in classic mode: a module-scoped fixture is set up before any test's
    spark_mode, and a step run in this process as a Connect client (build_connect_session sets
    PySpark's switch for the process) would leave the next module's classic fixtures building
    Connect columns."""
    if os.environ.get("CDC_TEST_SPARK_MODES", "").strip() != CONNECT:
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


@pytest.fixture(scope="session", autouse=True)
def warnings_on_stderr() -> None:
    """Steps called in this process show their warnings as the `cdc` command does (stderr
    lines a test reads with capsys), not as log records."""
    from spark_jobs.runtime.notices import show_warnings_on_stderr

    show_warnings_on_stderr()


@pytest.fixture(scope="session", autouse=True)
def connect_by_default(request: pytest.FixtureRequest) -> Iterator[None]:
    """With CDC_TEST_SPARK_MODES=connect, the whole run is a Connect client: also module-scoped
    fixtures that run `cdc` before any test's own mode applies."""
    if os.environ.get("CDC_TEST_SPARK_MODES", "").strip() != CONNECT:
        yield
        return
    server = request.getfixturevalue("connect_server")
    os.environ["CDC_SPARK_REMOTE"] = server.url
    try:
        yield
    finally:
        os.environ.pop("CDC_SPARK_REMOTE", None)


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local Spark Connect server for the test run (local[2], 2 shuffle partitions)."""
    from cdc_airflow.local import connect_server

    log = tmp_path_factory.mktemp("connect") / "server.log"
    server = connect_server.start(
        master="local[2]",
        conf={"spark.sql.shuffle.partitions": "2", WARM_UP_CONF: "true"},
        log_path=log,
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def spark_classic() -> Iterator[Any]:
    """The classic session of the test run (local[2], 2 shuffle partitions)."""
    os.environ.setdefault("CDC_SHUFFLE_PARTITIONS", "2")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)  # a classic session needs classic mode
    from spark_jobs.runtime.session import build_classic_session

    session = build_classic_session("cdc-tests", master="local[2]")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_connect(connect_server: Any) -> Iterator[Any]:
    """A Connect session of the test run's server, with the steps' SQL settings.

    Built with the Connect session class itself so the process stays in classic mode outside
    Connect tests (the `spark_mode` fixture switches it per test).
    """
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from spark_jobs.runtime.session import REQUIRED_SQL_CONF

    session = ConnectSession.builder.remote(connect_server.url).create()
    for key, value in {**REQUIRED_SQL_CONF, "spark.sql.shuffle.partitions": "2"}.items():
        session.conf.set(key, value)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest) -> Any:
    """The Spark session of a test: classic unless the test runs in Connect mode."""
    mode = getattr(request, "param", CLASSIC)
    if mode == CONNECT:
        # Session-scoped: created once; the per-test mode switch is spark_mode's.
        return request.getfixturevalue("spark_connect")
    if mode != CLASSIC:
        raise ValueError(f"unknown Spark mode {mode!r} (CDC_TEST_SPARK_MODES: classic, connect)")
    return request.getfixturevalue("spark_classic")


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workspace]:
    """Landing and warehouse roots of this test only (CDC_LANDING / CDC_WAREHOUSE point at them)."""
    ws = Workspace(tmp_path)
    monkeypatch.setenv("CDC_LANDING", str(ws.landing))
    monkeypatch.setenv("CDC_WAREHOUSE", str(ws.warehouse))
    monkeypatch.setenv("CDC_CONFIG", str(ws.config_path))
    yield ws


@pytest.fixture
def s3_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_server: Any
) -> Iterator[Workspace]:
    """The workspace with landing and warehouse in a new bucket of the session's S3 server
    (`s3://<bucket>/landing`, `s3://<bucket>/warehouse`); the AWS variables of that server set
    for this process and the `cdc` processes it starts."""
    from cdc_pipeline.paths import ObjectPath

    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    ws = Workspace(tmp_path, ObjectPath(s3_server.create_bucket()))
    monkeypatch.setenv("CDC_LANDING", str(ws.landing))
    monkeypatch.setenv("CDC_WAREHOUSE", str(ws.warehouse))
    monkeypatch.setenv("CDC_CONFIG", str(ws.config_path))
    yield ws


@pytest.fixture(params=["local", "s3"])
def any_workspace(request: pytest.FixtureRequest) -> Workspace:
    """The test once with local folders and once on the S3 server (the same assertions)."""
    name = "workspace" if request.param == "local" else "s3_workspace"
    workspace: Workspace = request.getfixturevalue(name)
    return workspace


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """One real PostgreSQL 15 with wal2json for the run (tests/postgres.py); each test creates
    its own database."""
    from tests import postgres

    reason = postgres.available()
    if reason:
        pytest.fail(f"PostgreSQL with wal2json cannot run: {reason} (make system installs it)")
    yield from postgres.running(postgres.scratch_root())


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real S3-compatible server (moto's, tests/s3.py) for the run; each test makes its own
    bucket."""
    from tests import s3

    reason = s3.available()
    if reason:
        pytest.fail(f"moto's S3 server cannot run: {reason}")
    yield from s3.running(tmp_path_factory.mktemp("s3") / "moto.log")


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real Kafka broker (KRaft single node, tests/kafka.py) for the run, started by the
    first test that asks for it and stopped by its pid at the end; each test makes its own
    topics. A test that stops or restarts it leaves it running."""
    from tests import kafka

    reason = kafka.available()
    if reason:
        pytest.fail(f"the Kafka broker cannot run: {reason}")
    yield from kafka.running(tmp_path_factory.mktemp("kafka"))
