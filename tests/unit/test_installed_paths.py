"""Where things are found from a checkout and, installed from the wheel, without one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import spark_jobs
from cdc_airflow.dag_files import DAG_FILES, write_dag_files
from cdc_airflow.local import launcher as local_airflow
from cdc_airflow.local.launcher import LocalAirflow
from cdc_pipeline import paths
from spark_jobs.runtime import session

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_cdc_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CDC_CONFIG", "CDC_LANDING", "CDC_WAREHOUSE", paths.JARS_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_cdc_environment: None) -> Path:
    """As if the packages ran from site-packages: no checkout; the working folder `tmp_path`."""
    monkeypatch.setattr(paths, "source_checkout", lambda: None)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_from_the_checkout_the_defaults_are_the_checkouts(no_cdc_environment: None) -> None:
    assert paths.source_checkout() == ROOT
    assert paths.default_config_path() == ROOT / "config" / "tables.yaml"
    assert (paths.landing_root(), paths.warehouse_root()) == (ROOT / "landing", ROOT / "warehouse")
    assert paths.spark_jars_dir() == ROOT / "jars"
    assert session.project_jars() == sorted((ROOT / "jars").glob("*.jar"))


def test_installed_the_defaults_are_under_the_working_folder_and_no_jars(installed: Path) -> None:
    assert paths.default_config_path() == installed / "config" / "tables.yaml"
    assert paths.landing_root() == installed.resolve() / "landing"
    assert paths.warehouse_root() == installed.resolve() / "warehouse"
    assert paths.spark_jars_dir() is None
    assert session.project_jars() == []
    assert "spark.jars" not in session.delta_conf()


def test_cdc_spark_jars_names_the_jars_folder(
    installed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jars = installed / "my-jars"
    jars.mkdir()
    for name in ("b.jar", "a.jar", "notes.txt"):
        (jars / name).write_text("")
    monkeypatch.setenv(paths.JARS_ENV, str(jars))
    assert session.project_jars() == [jars / "a.jar", jars / "b.jar"]
    assert session.delta_conf()["spark.jars"] == f"{jars / 'a.jar'},{jars / 'b.jar'}"


def test_the_log4j_configuration_is_the_spark_jobs_package_data() -> None:
    assert Path(spark_jobs.__file__).with_name("log4j2.properties") == session.LOG4J_FILE
    assert session.LOG4J_FILE.is_file()


def test_the_checkouts_dag_files_are_the_packaged_one_liners() -> None:
    for name, text in DAG_FILES.items():
        statements = [line for line in text.splitlines() if line.startswith(("from ", "import "))]
        checkout = (ROOT / "dags" / name).read_text().splitlines()
        assert statements == [line for line in checkout if line.startswith(("from ", "import "))]


def test_installed_the_local_launcher_writes_its_dag_files_into_its_home(
    installed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_airflow, "source_checkout", lambda: None)
    home = installed / "home"
    local = LocalAirflow(home, installed / "t.yaml", installed, installed, spark_connection="{}")
    monkeypatch.setattr(local, "airflow", lambda *args, **kwargs: None)
    monkeypatch.setattr(local, "create_pools", lambda: None)
    local.migrate()
    env: dict[str, Any] = local.environment()
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(home / "dags")
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == str(home / "plugins")
    assert sorted(p.name for p in (home / "dags").iterdir()) == sorted(DAG_FILES)
    write_dag_files(home / "dags")  # again: the same files, replaced
    assert (home / "dags" / "cdc_tables.py").read_text() == DAG_FILES["cdc_tables.py"]
