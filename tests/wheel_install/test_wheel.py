"""The wheel installed (not editable) in a fresh venv works from a folder outside the checkout.

One build and one venv for the module (tests/wheel_install/wheel_venv.py): the wheel holds every
module and the files the code reads; every module imports from the venv; `cdc validate` and
`cdc run` apply an update and a delete exactly with the installed defaults (config, landing
and warehouse under the working directory); Airflow loads the DAGs of the one-line DAG files,
the provider info and the view from the package's entry points, and one `dags test` passes.
The Spark steps run against a Spark Connect server started from the venv's own package
(installed with `[spark]`, the full pyspark).

The light install (the wheel without extras: pyspark-client, the Spark Connect client, and no
Spark jars) in a venv of its own: classic Spark fails with one line saying what to install;
Airflow loads the DAGs, the provider and the view; `cdc run` applies an update and a delete
exactly as a client of a Connect server run by the test run's own venv (tests/conftest.py). The
operator's `dags test` in a light install: tests/wheel_install/test_lowest_airflow.py.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_airflow.local.connect_server import free_port, port_open
from cdc_airflow.local.launcher import connect_connection
from cdc_pipeline.jvm import connect_address
from tests.helpers import Workspace, table_rows
from tests.wheel_install.wheel_venv import (
    PACKAGES,
    REPO,
    clean_environment,
    make_venv,
    run,
    source_modules,
    wheel_metadata,
    wheel_modules,
    wheel_names,
)

pytestmark = pytest.mark.slow

# What a user drops into the DAGs folder: one line each (cdc_airflow/dag_files).
DAG_FILES = {
    "cdc_tables.py": "from cdc_airflow.dag_files.tables import *\n",
    "cdc_config_errors.py": "from cdc_airflow.dag_files.config_errors import *\n",
}
# Imports every module of the four packages; prints where each came from and the import system.
IMPORT_ALL = """
import importlib, json, pkgutil, sys
from importlib import metadata
files, errors = {}, {}
for package in sys.argv[1:]:
    root = importlib.import_module(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, package + ".")]
    for name in names:
        try:
            files[name] = importlib.import_module(name).__file__
        except Exception as error:
            errors[name] = f"{type(error).__name__}: {error}"
direct_url = metadata.distribution("cdc-lakehouse").read_text("direct_url.json") or "{}"
print("RESULT " + json.dumps({
    "files": files, "errors": errors, "direct_url": json.loads(direct_url),
    "finders": [type(f).__name__ for f in sys.meta_path],
}))
"""
# The DAGs folder as Airflow's DagBag reads it, the provider and the plugins Airflow found.
AIRFLOW_SEES = """
import json, sys
from airflow import plugins_manager
from airflow.dag_processing.dagbag import DagBag
from airflow.providers_manager import ProvidersManager
bag = DagBag(dag_folder=sys.argv[1])
provider = ProvidersManager().providers["cdc-lakehouse"]
print("RESULT " + json.dumps({
    "dags": {d: bag.dags[d].fileloc for d in bag.dag_ids},
    "import_errors": bag.import_errors,
    "provider": provider.data,
    "plugins": {p["name"]: p["source"] for p in plugins_manager.get_plugin_info()},
    "plugin_errors": plugins_manager.get_import_errors(),
}, default=str))
"""


def columns_row(name: str) -> dict[str, object]:
    """A CSV table keyed by ID, sequenced by TS, with no maintenance step."""
    return {
        "name": name,
        "file_format": "csv",
        "columns": {"ID": "bigint", "VALUE": "int", "TS": "timestamp"},
        "keys": ["ID"],
        "sequence_by": ["TS"],
        "optimize_schedule": None,
        "vacuum_schedule": None,
        "reset_staging_schedule": None,
        "start_date": "2024-01-01",
    }


def land_changes(ws: Workspace, table: str) -> list[tuple[int, int]]:
    """One hour of changes (inserts, an update, a delete); the final rows they leave."""
    ts = "2024-01-01 00:00:0"
    ws.land(
        table,
        "2024-01-01T00",
        "changes.csv",
        [
            {"FLAG": "I", "ID": 1, "VALUE": 1, "TS": f"{ts}1"},
            {"FLAG": "I", "ID": 2, "VALUE": 2, "TS": f"{ts}1"},
            {"FLAG": "I", "ID": 3, "VALUE": 3, "TS": f"{ts}1"},
            {"FLAG": "U", "ID": 1, "VALUE": 10, "TS": f"{ts}2"},
            {"FLAG": "D", "ID": 2, "VALUE": None, "TS": f"{ts}3"},
        ],
    )
    return [(1, 10), (3, 3)]


def result_of(output: str) -> dict:
    """The JSON a probe script printed after `RESULT `."""
    (line,) = [x for x in output.splitlines() if x.startswith("RESULT ")]
    return dict(json.loads(line.removeprefix("RESULT ")))


@dataclass
class Installed:
    """The built wheel, the venv it is installed in, a working folder outside the checkout and
    a Spark Connect server run by the venv's package (started at once, waited for on use)."""

    wheel: Path
    venv: Path
    work: Path
    env: dict[str, str]
    server: subprocess.Popen[bytes] | None = None
    server_port: int = 0

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def source(self) -> Path:
        """The copy of the checkout the wheel was built from (build_wheel)."""
        return self.wheel.parents[1] / "source"

    @property
    def server_log(self) -> Path:
        return self.work.parent / "spark-connect.log"

    def run(self, *args: str, env: dict[str, str] | None = None) -> str:
        """A command of the venv run in the working folder; its stdout and stderr."""
        result = run(list(args), env=env or self.env, cwd=self.work)
        return result.stdout + result.stderr

    def start_server(self) -> None:
        """Start the Connect server in its own process group (the JVM starts meanwhile)."""
        self.server_port = free_port()
        command = [self.python, "-m", "cdc_airflow.local.connect_server", "--exec"]
        with self.server_log.open("w") as log:
            self.server = subprocess.Popen(
                [*command, "--port", str(self.server_port)],
                env=self.env,
                cwd=self.work,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def connect_url(self, timeout: float = 300) -> str:
        """The server's URL once it runs queries (its port open, then one probe query)."""
        assert self.server is not None
        deadline = time.monotonic() + timeout
        while not port_open("127.0.0.1", self.server_port):
            assert self.server.poll() is None and time.monotonic() < deadline, (
                f"no Connect server:\n{self.server_log.read_text()[-4000:]}"
            )
            time.sleep(1)
        url = f"sc://127.0.0.1:{self.server_port}"
        self.run(self.python, "-m", "cdc_airflow.local.connect_server", "--probe", url)
        return url

    def stop_server(self) -> None:
        """Stop the server's process group."""
        if self.server is not None and self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGTERM)
            self.server.wait(timeout=60)


def install(wheel: Path, scratch: Path, extras: frozenset[str] = frozenset()) -> Installed:
    """The wheel with `extras` in a fresh venv under `scratch`, a working folder beside it."""
    started = time.monotonic()
    venv = scratch / "venv"
    make_venv(venv, wheel, os.environ.get("CDC_TEST_WHEEL_DEPS", "linked"), extras)
    print(
        f"\nwheel{sorted(extras) or ''} installed with its dependencies in "
        f"{time.monotonic() - started:.1f} s"
    )
    work = scratch / "work"
    work.mkdir()
    assert not work.resolve().is_relative_to(REPO)
    return Installed(wheel, venv, work, clean_environment(venv, scratch / "airflow_home"))


@pytest.fixture(scope="session")
def installed(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    result = install(built_wheel, tmp_path_factory.mktemp("full"), frozenset({"spark"}))
    result.start_server()
    try:
        yield result
    finally:
        result.stop_server()


def test_the_wheel_holds_every_module_the_log4j_file_and_the_entry_points(
    installed: Installed,
) -> None:
    modules = wheel_modules(installed.wheel)
    assert modules == source_modules(installed.source)
    assert {m.split(".")[0] for m in modules} == set(PACKAGES)  # no tests, no dags, no plugins
    names = wheel_names(installed.wheel)
    assert "spark_jobs/log4j2.properties" in names
    assert "spark_jobs/runtime/hadoop_defaults/yarn-default.xml" in names
    entry_points = wheel_metadata(installed.wheel, "entry_points.txt")
    assert "cdc = cdc_tools.cli:console_main" in entry_points
    assert "provider_info = cdc_airflow.provider:get_provider_info" in entry_points
    assert "cdc_tables = cdc_airflow.view.plugin:CdcTablesPlugin" in entry_points


def test_every_module_imports_from_the_venv_outside_the_checkout(installed: Installed) -> None:
    result = result_of(installed.run(installed.python, "-c", IMPORT_ALL, *PACKAGES))
    assert result["errors"] == {}
    assert set(result["files"]) == source_modules(installed.source)
    site = installed.venv / "lib" / "python3.11" / "site-packages"
    outside = {m: f for m, f in result["files"].items() if not Path(f).is_relative_to(site)}
    assert outside == {}
    # Installed from the wheel file, not as an editable link back to the checkout.
    assert result["direct_url"].get("dir_info", {}).get("editable") is not True
    assert not any("Editable" in finder for finder in result["finders"])


def test_cdc_validate_and_run_apply_an_update_and_a_delete_with_the_installed_defaults(
    installed: Installed,
) -> None:
    check_cdc_run(installed, installed.connect_url())


def check_cdc_run(installed: Installed, connect_url: str) -> None:
    """`cdc validate`, then `cdc run` of one hour as a client of `connect_url`: final exact."""
    # Installed, the defaults are under the working folder: config/tables.yaml, landing/,
    # warehouse/ (docs/operations.md); no CDC_CONFIG, CDC_LANDING or CDC_WAREHOUSE.
    ws = Workspace(installed.work)
    (installed.work / "config").mkdir(exist_ok=True)
    config = {"tables": [columns_row("t_cli"), columns_row("t_dag")]}
    (installed.work / "config" / "tables.yaml").write_text(yaml.safe_dump(config))
    expected = land_changes(ws, "t_cli")
    output = installed.run("cdc", "validate", "--json")
    summary = json.loads(output.splitlines()[0])
    assert summary["ok"] and summary["tables"] == ["t_cli", "t_dag"], output
    env = {**installed.env, "CDC_SPARK_REMOTE": connect_url}
    start, end = "2024-01-01T00:00:00Z", "2024-01-01T01:00:00Z"
    began = time.monotonic()
    installed.run("cdc", "run", "t_cli", "--start", start, "--end", end, env=env)
    print(f"\ncdc run of one hour in Connect mode: {time.monotonic() - began:.1f} s")
    assert table_rows(ws.paths("t_cli").final, ["ID", "VALUE"]) == expected


def test_airflow_loads_the_one_line_dag_files_provider_and_view_and_a_dags_test_passes(
    installed: Installed,
) -> None:
    check_airflow(installed, installed.connect_url())


def check_airflow(installed: Installed, connect_url: str, dags_test: bool = True) -> None:
    """The DAG files, the provider and the view as Airflow finds them; then (`dags_test`) one
    `dags test` whose steps are clients of `connect_url`: final exact."""
    ws = Workspace(installed.work / "airflow-data")
    ws.root.mkdir()
    ws.configure(columns_row("t_dag"))
    expected = land_changes(ws, "t_dag")
    dags = installed.work / "dags"
    dags.mkdir()
    for name, line in DAG_FILES.items():
        (dags / name).write_text(line)
    home = Path(installed.env["AIRFLOW_HOME"])
    host, port = connect_address(connect_url)
    env = {
        **installed.env,
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_SPARK_DEFAULT": connect_connection(port, host),
        "CDC_CONFIG": str(ws.config_path),
        "CDC_LANDING": str(ws.landing),
        "CDC_WAREHOUSE": str(ws.warehouse),
    }
    seen = result_of(installed.run(installed.python, "-c", AIRFLOW_SEES, str(dags), env=env))
    assert seen["import_errors"] == {}
    assert seen["dags"] == {"cdc_t_dag": str(dags / "cdc_tables.py")}
    assert seen["provider"]["package-name"] == "cdc-lakehouse"
    assert set(seen["provider"]["config"]["cdc"]["options"]) == {"task_processes"}
    assert seen["plugins"]["cdc_tables"].startswith("cdc-lakehouse==0.1.0: EntryPoint(")
    assert seen["plugin_errors"] == {}
    if not dags_test:
        return

    installed.run(installed.python, "-m", "airflow", "db", "migrate", env=env)
    output = installed.run(
        installed.python,
        "-m",
        "airflow",
        "dags",
        "test",
        "cdc_t_dag",
        "2024-01-01T01:00:00+00:00",
        env=env,
    )
    assert "Spark-Submit cmd" not in output  # Connect mode: the steps are clients of the server
    assert table_rows(ws.paths("t_dag").final, ["ID", "VALUE"]) == expected
    with sqlite3.connect(home / "airflow.db") as db:
        states = dict(
            db.execute("SELECT task_id, state FROM task_instance WHERE dag_id = 'cdc_t_dag'")
        )
    assert states["stage"] == states["overwrite_final"] == states["check"] == "success", states


@pytest.fixture(scope="session")
def light(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel without extras (pyspark-client, no Spark jars) in a venv of its own."""
    return install(built_wheel, tmp_path_factory.mktemp("light"))


# What the light venv holds of Spark, and whether its PySpark is the Connect client only.
SPARK_INSTALLED = """
import json, importlib.metadata as md, pathlib, pyspark
from pyspark.util import is_remote_only
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
jars = pathlib.Path(pyspark.__file__).parent / "jars"
print("RESULT " + json.dumps({
    "pyspark": version("pyspark"), "pyspark-client": version("pyspark-client"),
    "jars": sorted(p.name for p in jars.glob("*.jar")) if jars.is_dir() else None,
    "remote_only": is_remote_only(),
}))
"""


def test_the_light_install_has_only_the_connect_client_and_classic_spark_says_what_to_install(
    light: Installed,
) -> None:
    spark = result_of(light.run(light.python, "-c", SPARK_INSTALLED))
    assert spark["pyspark"] is None and spark["pyspark-client"] == "4.2.0", spark
    assert not any(j.startswith("spark-core") for j in spark["jars"] or []), spark["jars"]
    assert spark["remote_only"] is True
    assert not (light.venv / "bin" / "spark-submit").exists()
    # No CDC_SPARK_REMOTE: a classic session, which this install cannot start: one line.
    (light.work / "config").mkdir(exist_ok=True)
    config = {"tables": [columns_row("t_classic")]}
    (light.work / "config" / "tables.yaml").write_text(yaml.safe_dump(config))
    land_changes(Workspace(light.work), "t_classic")
    command = ["cdc", "run", "t_classic", "--start", "2024-01-01", "--end", "2024-01-01T01:00:00Z"]
    result = subprocess.run(
        command, env=light.env, cwd=light.work, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "`cdc-lakehouse[spark]`" in line and "CDC_SPARK_REMOTE" in line, line
    # Nor can it run a Connect server of its own (`make airflow`'s, the image's).
    server = [light.python, "-m", "cdc_airflow.local.connect_server", "--exec", "--port", "1"]
    result = subprocess.run(
        server, env=light.env, cwd=light.work, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0 and "install `cdc-lakehouse[spark]`" in result.stderr


def test_the_light_install_loads_the_dags_and_runs_cdc_as_a_client_of_a_connect_server(
    light: Installed, connect_server: Any
) -> None:
    # The server is the test run's (tests/conftest.py), from its own venv with the full pyspark.
    began = time.monotonic()
    check_airflow(light, connect_server.url, dags_test=False)
    check_cdc_run(light, connect_server.url)
    print(f"\nlight install: DagBag and cdc run in {time.monotonic() - began:.1f} s")
